package prewarm_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/prewarm"
)

// simServer is a Server over the simulated engine (pseudo-tokens, no
// model), closed at the end of the test.
func simServer(t *testing.T, simOpts []enginetest.SimOption, opts ...mlxserving.Option) (*enginetest.Sim, *mlxserving.Server) {
	t.Helper()
	sim, err := enginetest.NewSim(append([]enginetest.SimOption{enginetest.WithVocabSize(1000), enginetest.WithContextLength(512)}, simOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := mlxserving.New(sim, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
		_ = sim.Close()
	})
	return sim, srv
}

func simModel(id string) prewarm.Model {
	return prewarm.Model{Spec: engine.ModelSpec{ID: id}}
}

func register(t *testing.T, srv *mlxserving.Server, models ...prewarm.Model) {
	t.Helper()
	for _, m := range models {
		if err := srv.RegisterModel(m); err != nil {
			t.Fatal(err)
		}
	}
}

// generate runs one request to the end.
func generate(ctx context.Context, srv *mlxserving.Server, id string, maxTokens int) (api.Result, error) {
	st, err := srv.Generate(ctx, api.Request{Model: id, PromptTokens: []int32{5, 6, 7}, Params: api.Params{MaxTokens: maxTokens, IgnoreEOS: true}})
	if err != nil {
		return api.Result{}, err
	}
	return st.Collect()
}

func mustGenerate(t *testing.T, srv *mlxserving.Server, id string) {
	t.Helper()
	if res, err := generate(context.Background(), srv, id, 3); err != nil || len(res.Tokens) != 3 {
		t.Fatalf("generate on %q: %v, %v", id, res, err)
	}
}

func status(srv *mlxserving.Server, id string) prewarm.ModelStatus {
	for _, st := range srv.ModelStatus() {
		if st.ID == id {
			return st
		}
	}
	return prewarm.ModelStatus{ID: id, State: -1}
}

func states(srv *mlxserving.Server) map[string]prewarm.State {
	out := map[string]prewarm.State{}
	for _, st := range srv.ModelStatus() {
		out[st.ID] = st.State
	}
	return out
}

// waitFor polls cond: unloading happens on the manager's goroutine.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

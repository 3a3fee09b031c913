package redisaffinity_test

import (
	"context"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer/redisaffinity"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/merge"
	"github.com/mlxserving/mlxserving/testmodel"
)

var _ merge.SharedCache = (*redisaffinity.ResponseCache)(nil)

// TestSharedResponseCacheAcrossInstances: two instances of the same
// checkpoint share their response cache through Redis: a response the
// first generated is a hit on the second, which runs no step; with Redis
// down the second still answers, by generating.
func TestSharedResponseCacheAcrossInstances(t *testing.T) {
	r := startRedis(t)
	rc, err := redisaffinity.NewResponseCache(client(t, r))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := testmodel.Tiny()
	if err := testmodel.Write(dir, cfg); err != nil {
		t.Fatal(err)
	}
	instance := func() (*mlxserving.Server, *enginetest.Sim) {
		sim, err := enginetest.NewSim(enginetest.WithVocabSize(cfg.Vocab), enginetest.WithContextLength(cfg.ContextLength))
		if err != nil {
			t.Fatal(err)
		}
		srv, err := mlxserving.New(sim, mlxserving.WithMerging(merge.WithCache(1<<20, time.Minute), merge.WithSharedCache(rc, time.Minute)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Close(); _ = sim.Close() })
		if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir}); err != nil {
			t.Fatal(err)
		}
		return srv, sim
	}
	a, _ := instance()
	b, simB := instance()
	req := api.Request{Model: "tiny", Prompt: "The shared cache", Params: api.Params{MaxTokens: 12, IgnoreEOS: true, Cache: true}}
	run := func(srv *mlxserving.Server) (api.Result, string) {
		st, err := srv.Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		res, err := st.Collect()
		if err != nil {
			t.Fatal(err)
		}
		return res, st.Header().Cache
	}
	want, outcome := run(a)
	if outcome != "miss" || len(want.Tokens) != 12 {
		t.Fatalf("first instance: %q, %d tokens", outcome, len(want.Tokens))
	}
	got, outcome := run(b)
	if outcome != "hit" || got.Text != want.Text || len(got.Tokens) != 12 || got.Usage.CompletionTokens != 12 {
		t.Fatalf("second instance: %q %q, want a hit with %q", outcome, got.Text, want.Text)
	}
	if s := simB.Stats().Sampled; s != 0 {
		t.Errorf("the hit ran the second instance's engine: %d tokens sampled", s)
	}
	if st := b.MergeStats(); st.SharedHits != 1 {
		t.Errorf("second instance's stats: %+v", st)
	}
	// Redis gone: a new request still succeeds, generated locally.
	r.stop()
	req.Prompt = "Another prompt"
	if _, outcome := run(b); outcome != "miss" {
		t.Errorf("with Redis down: %q, want a miss", outcome)
	}
	if st := b.MergeStats(); st.SharedErrors == 0 {
		t.Errorf("the failed shared look-up was not counted: %+v", st)
	}
}

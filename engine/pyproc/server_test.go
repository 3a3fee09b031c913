package pyproc

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
)

// TestThroughServer runs concurrent requests through the whole stack
// (Server → scheduler → batcher → pyproc → worker) and checks each gets
// exactly the greedy tokens the engine gives that prompt alone.
func TestThroughServer(t *testing.T) {
	e := newEngine(t, WithWorkers(2))
	direct := load(t, e, tiny(t))
	srv, err := mlxserving.New(e)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	if err := srv.LoadModel(ctx, engine.ModelSpec{ID: "tiny-served", Path: tiny(t)}); err != nil {
		t.Fatal(err)
	}
	const n, maxTokens = 8, 12
	want := make([][]int32, n)
	for i := range want {
		want[i] = generate(t, direct, engine.SeqID(i+1), prompt(i, 5+3*i), maxTokens)
	}
	got := make([][]int32, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := srv.Generate(ctx, api.Request{Model: "tiny-served", PromptTokens: prompt(i, 5+3*i),
				Params: api.Params{MaxTokens: maxTokens, IgnoreEOS: true}})
			if err != nil {
				errs[i] = err
				return
			}
			res, err := st.Collect()
			got[i], errs[i] = res.Tokens, err
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("request %d: served %v, engine alone %v", i, got[i], want[i])
		}
	}
}

package mlxserving_test

import (
	"context"
	"sync"
	"testing"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestFullContextRunsOneBatch: the generated test model with a real
// model's 131,072-token context, on the Python engine (CPU) with nothing
// overridden, and 48 concurrent requests that may each run to the end of
// the context. The engine keeps KV in blocks taken as sequences grow, so
// the 48 run as one batch; with a whole-context slot per sequence the CPU
// pool (1 GiB) would hold 16 of them.
func TestFullContextRunsOneBatch(t *testing.T) {
	const n, ctxLen, tokens = 48, 131072, 16
	e := pythonEngine(t, 1)
	dir := t.TempDir()
	cfg := testmodel.Tiny()
	cfg.ContextLength = ctxLen
	if err := testmodel.Write(dir, cfg); err != nil {
		t.Fatal(err)
	}
	srv, err := mlxserving.New(e)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	if err := srv.LoadModel(ctx, engine.ModelSpec{ID: "tiny", Path: dir}); err != nil {
		t.Fatal(err)
	}
	info := srv.Models()[0]
	if info.ContextLength != ctxLen || !info.Paged() {
		t.Fatalf("loaded with context %d, block size %d; want %d, paged", info.ContextLength, info.BlockSize, ctxLen)
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		p := seq(i*11+1, 30)
		// Each asks for what the context allows and stops reading after
		// 16 tokens, the way a client that got what it wanted hangs up.
		r := api.Request{Model: "tiny", PromptTokens: p, Params: api.Params{MaxTokens: ctxLen - len(p), IgnoreEOS: true}}
		wg.Go(func() {
			rctx, cancel := context.WithCancel(ctx)
			defer cancel()
			st, err := srv.Generate(rctx, r)
			if err != nil {
				errs[i] = err
				return
			}
			for got := 0; got < tokens; {
				c, err := st.Recv()
				if err != nil {
					errs[i] = err
					return
				}
				if c.HasToken {
					got++
				}
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	st := srv.Stats()["tiny"].Batcher
	mean := float64(st.Inputs) / float64(st.Steps)
	t.Logf("%d steps, mean batch %.1f, pool %d blocks of %d, %d block preemptions", st.Steps, mean, st.KVBlocks, info.BlockSize, st.BlockPreemptions)
	if mean < n*0.8 {
		t.Errorf("mean batch %.1f over %d steps; want the %d requests in one batch", mean, st.Steps, n)
	}
}

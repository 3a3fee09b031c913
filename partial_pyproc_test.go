package mlxserving_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestTwoWorkersShortOfBlocks: on two workers whose pools hold a few
// blocks each, concurrent greedy requests fill one worker's pool while
// the other has room, so steps find one worker short of blocks while the
// two pools together have room. Every stream equals the request's stream
// alone on a pool with room to spare: no sequence is fed a token twice,
// none fails, pipelined or not.
func TestTwoWorkersShortOfBlocks(t *testing.T) {
	e := pythonEngine(t, 2)
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	reqs := make([]api.Request, 12)
	for i := range reqs {
		reqs[i] = api.Request{Model: "tiny", PromptTokens: seq(i*13+1, 10+i*7%30), Params: api.Params{MaxTokens: 24, IgnoreEOS: true}}
	}
	ample, err := mlxserving.New(e)
	if err != nil {
		t.Fatal(err)
	}
	defer ample.Close()
	if err := ample.LoadModel(ctx, engine.ModelSpec{ID: "tiny", Path: dir}); err != nil {
		t.Fatal(err)
	}
	want := make([][]int32, len(reqs))
	for i, r := range reqs {
		res, _ := run(t, ample, r)
		want[i] = res.Tokens
	}
	for _, pipeline := range []bool{true, false} {
		t.Run(fmt.Sprintf("pipeline=%v", pipeline), func(t *testing.T) {
			srv, err := mlxserving.New(e, mlxserving.WithBatcherOptions(batcher.WithPipeline(pipeline)))
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			// 6 blocks of 16 tokens per worker.
			if err := srv.LoadModel(ctx, engine.ModelSpec{ID: "tiny", Path: dir, KVCapacity: 2 * 6 * 16}); err != nil {
				t.Fatal(err)
			}
			got := make([][]int32, len(reqs))
			errs := make([]error, len(reqs))
			var wg sync.WaitGroup
			for i, r := range reqs {
				wg.Go(func() {
					st, err := srv.Generate(ctx, r)
					if err == nil {
						var res api.Result
						res, err = st.Collect()
						got[i] = res.Tokens
					}
					errs[i] = err
				})
			}
			wg.Wait()
			for i := range reqs {
				if errs[i] != nil {
					t.Errorf("request %d: %v", i, errs[i])
				} else if !slices.Equal(got[i], want[i]) {
					t.Errorf("request %d: %v\nalone on a large pool: %v", i, got[i], want[i])
				}
			}
			st := srv.Stats()["tiny"].Batcher
			t.Logf("%d steps, %d ran in part, %d block preemptions, %d pipelined", st.Steps, st.PartialSteps, st.BlockPreemptions, st.Pipelined)
			if st.PartialSteps == 0 {
				t.Error("no step ran in part: the test did not run its case")
			}
		})
	}
}

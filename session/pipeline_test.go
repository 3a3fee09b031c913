package session

import (
	"context"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// TestCachePipelineConformance: the wrapped model passes the conformance
// suite of engine.Pipeliner.
func TestCachePipelineConformance(t *testing.T) {
	sim, err := enginetest.NewSim(enginetest.WithVocabSize(500), enginetest.WithContextLength(512), enginetest.WithMaxBatch(8), enginetest.WithBlockSize(4))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	enginetest.RunPipeline(t, cachingEngine{sim}, "")
}

// pipelinedTurn is turn with the steps sent ahead: the open answered
// behind the first chunk (Opening), each decode feeding the pending
// step's sample (Prev).
func pipelinedTurn(t *testing.T, c *PrefixCache, id engine.SeqID, prompt []int32, key, save string, n int) (int, []int32) {
	t.Helper()
	ctx := context.Background()
	po, ok := c.OpenAsync(ctx, id, prompt, key)
	if !ok {
		t.Fatal("OpenAsync declined")
	}
	first, ok, err := c.StepAsync(ctx, []engine.StepInput{{Seq: id, Tokens: prompt, Sample: true, Params: greedy, Opening: true}})
	if err != nil || !ok {
		t.Fatalf("StepAsync: ok %v, %v", ok, err)
	}
	r, err := po.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pend := first
	var out []int32
	for len(out) < n {
		var next engine.PendingStep
		if len(out)+1 < n {
			if next, _, err = c.StepAsync(ctx, []engine.StepInput{{Seq: id, Prev: true, Sample: true, Params: greedy}}); err != nil {
				t.Fatal(err)
			}
		}
		o, err := pend.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, o[0].Token)
		pend = next
	}
	c.Free(id, save)
	return r, out
}

// TestPipelinedTurnsIndexLikeSynchronous: turns run with pipelined steps
// leave the index the KV they were fed, as synchronous turns do: a
// session's next turn reuses as much, and the tokens match.
func TestPipelinedTurnsIndexLikeSynchronous(t *testing.T) {
	run := func(pipelined bool) (reused []int, outs [][]int32, st CacheStats) {
		c := newCache(t, newSimModel(t, enginetest.WithBlockSize(4)))
		key := c.NewKey()
		history := tokens(1, 37)
		for turnNo := range 4 {
			id := engine.SeqID(turnNo + 1)
			var r int
			var out []int32
			if pipelined {
				r, out = pipelinedTurn(t, c, id, history, key, key, 6)
			} else {
				r, out = turn(t, c, id, history, key, key, 6)
			}
			reused, outs = append(reused, r), append(outs, out)
			history = append(append(slices.Clone(history), out...), tokens(10+turnNo, 9)...)
		}
		return reused, outs, c.Stats()
	}
	sr, so, sst := run(false)
	pr, po, pst := run(true)
	if !slices.Equal(sr, pr) || sst.Tokens != pst.Tokens || sst.Hits != pst.Hits {
		t.Errorf("reused %v / %v, indexed tokens %d / %d, hits %d / %d (synchronous / pipelined)", sr, pr, sst.Tokens, pst.Tokens, sst.Hits, pst.Hits)
	}
	for i := range so {
		if !slices.Equal(so[i], po[i]) {
			t.Errorf("turn %d: %v synchronous, %v pipelined", i, so[i], po[i])
		}
	}
	if pr[1] == 0 {
		t.Errorf("the second turn reused nothing: %v", pr)
	}
}

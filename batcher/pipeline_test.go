package batcher_test

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// pipelineWorkload is a random mix of requests: greedy, seeded
// temperature, penalties and log-probabilities; length stops, stop
// tokens and stop strings; on a paged pool tight enough to preempt for
// some seeds. lengthOnly leaves out every stop but the length.
func pipelineWorkload(seed uint64, lengthOnly bool) ([]*batcher.Sequence, []enginetest.SimOption, []batcher.Option) {
	rng := rand.New(rand.NewPCG(seed, 41))
	bs := []int{4, 8, 16}[rng.IntN(3)]
	blocks := 16 + rng.IntN(48)
	ctxLen := blocks * bs
	seqs := make([]*batcher.Sequence, 30+rng.IntN(30))
	for i := range seqs {
		plen := 1 + rng.IntN(min(ctxLen/2, 80))
		s := &batcher.Sequence{Prompt: prompt(int(seed)*1000+i, plen), MaxTokens: 1 + rng.IntN(min(ctxLen-plen, 40)), IgnoreEOS: true}
		switch rng.IntN(4) {
		case 1:
			s.Params = api.SamplingParams{Temperature: 0.8, TopP: 0.9, Seed: uint64(i), HasSeed: true}
		case 2:
			s.Params = api.SamplingParams{Temperature: 1, Seed: uint64(i) + 7, HasSeed: true, PresencePenalty: 0.5, FrequencyPenalty: 0.3, RepetitionPenalty: 1.1}
		case 3:
			s.Params = api.SamplingParams{Logprobs: true, TopLogprobs: 2}
		}
		if !lengthOnly {
			switch rng.IntN(4) {
			case 1:
				s.IgnoreEOS = false
			case 2:
				s.StopTokens = []int32{int32(1 + rng.IntN(150))}
			case 3:
				s.Text = &stopAfter{n: 1 + rng.IntN(s.MaxTokens)}
			}
		}
		seqs[i] = s
	}
	sim := []enginetest.SimOption{enginetest.WithBlockSize(bs), enginetest.WithKVCapacity(ctxLen), enginetest.WithContextLength(ctxLen), enginetest.WithEOSProbability(0.05)}
	opts := []batcher.Option{batcher.WithMaxBatch(2 + rng.IntN(14)), batcher.WithTokenBudget(16 + rng.IntN(100))}
	return seqs, sim, opts
}

// cloneSeqs returns fresh sequences asking for what seqs ask.
func cloneSeqs(seqs []*batcher.Sequence) []*batcher.Sequence {
	out := make([]*batcher.Sequence, len(seqs))
	for i, s := range seqs {
		c := &batcher.Sequence{Prompt: s.Prompt, MaxTokens: s.MaxTokens, IgnoreEOS: s.IgnoreEOS, Params: s.Params, StopTokens: s.StopTokens, Tier: s.Tier}
		if st, ok := s.Text.(*stopAfter); ok {
			c.Text = &stopAfter{n: st.n}
		}
		out[i] = c
	}
	return out
}

// TestPipelinedMatchesSynchronous: on a model that takes steps ahead
// (engine.Pipeliner), the streams are those of the synchronous loop, token
// for token, with the same finish reasons; and steps are sent ahead.
func TestPipelinedMatchesSynchronous(t *testing.T) {
	for seed := range uint64(6) {
		seqs, simOpts, opts := pipelineWorkload(seed, false)
		sync := runQueued(t, simOpts, cloneSeqs(seqs), append(opts, batcher.WithPipeline(false))...)
		if lastStats.Pipelined != 0 || lastSim.Pipelined != 0 {
			t.Fatalf("seed %d: WithPipeline(false) sent %d steps ahead", seed, lastStats.Pipelined)
		}
		piped := runQueued(t, simOpts, cloneSeqs(seqs), opts...)
		st, sim := lastStats, lastSim
		if st.Pipelined == 0 || sim.Pipelined != int64(st.Pipelined) {
			t.Fatalf("seed %d: %d steps sent ahead (engine counted %d)", seed, st.Pipelined, sim.Pipelined)
		}
		stops := 0
		for i := range seqs {
			a, b := sync[i], piped[i]
			if a.err != nil || b.err != nil {
				t.Fatalf("seed %d request %d: errors %v / %v", seed, i, a.err, b.err)
			}
			if !slices.Equal(a.tokens, b.tokens) || a.finish != b.finish {
				t.Fatalf("seed %d request %d: synchronous %v %q, pipelined %v %q", seed, i, a.tokens, a.finish, b.tokens, b.finish)
			}
			if b.finish == api.FinishStop {
				stops++
			}
		}
		// A sequence that stops on a token has run one row for nothing;
		// one that stops on its length none.
		if sim.Wasted > int64(stops) {
			t.Errorf("seed %d: %d rows wasted for %d stops on a token", seed, sim.Wasted, stops)
		}
		t.Logf("seed %d: %d requests, %d of %d steps ahead, %d drains, %d wasted rows, %d block preemptions",
			seed, len(seqs), st.Pipelined, st.Steps, st.Drains, sim.Wasted, st.BlockPreemptions)
	}
}

// TestPipelineWastesNoRowOnLength: a sequence at its last token is left
// out of the step planned behind it, so length stops waste nothing.
func TestPipelineWastesNoRowOnLength(t *testing.T) {
	for seed := range uint64(4) {
		seqs, simOpts, opts := pipelineWorkload(seed, true)
		res := runQueued(t, simOpts, seqs, opts...)
		for i, r := range res {
			if r.err != nil || r.finish != api.FinishLength || len(r.tokens) != seqs[i].MaxTokens {
				t.Fatalf("seed %d request %d: %d tokens, finish %q, err %v", seed, i, len(r.tokens), r.finish, r.err)
			}
		}
		if lastSim.Wasted != 0 || lastStats.Pipelined == 0 {
			t.Errorf("seed %d: %d rows wasted, %d steps ahead", seed, lastSim.Wasted, lastStats.Pipelined)
		}
	}
}

// TestPipelineSmallBatchesSynchronous: a model that runs small batches
// better synchronously (StepAsync's ok false) gets them through Step,
// and the streams are the same.
func TestPipelineSmallBatchesSynchronous(t *testing.T) {
	seqs, simOpts, opts := pipelineWorkload(3, false)
	want := runQueued(t, simOpts, cloneSeqs(seqs), append(opts, batcher.WithPipeline(false))...)
	got := runQueued(t, append(simOpts, enginetest.WithPipelineAbove(4)), cloneSeqs(seqs), opts...)
	for i := range want {
		if !slices.Equal(want[i].tokens, got[i].tokens) || want[i].finish != got[i].finish || got[i].err != nil {
			t.Fatalf("request %d: %v %q, want %v %q (err %v)", i, got[i].tokens, got[i].finish, want[i].tokens, want[i].finish, got[i].err)
		}
	}
	if lastSim.Declined == 0 {
		t.Error("no batch was declined: the test does not cover the synchronous fallback")
	}
}

// TestPipelineNotAPipeliner: a model without the capability steps
// synchronously as before.
func TestPipelineNotAPipeliner(t *testing.T) {
	seqs, simOpts, opts := pipelineWorkload(1, false)
	runQueued(t, append(simOpts, enginetest.WithoutPipeline()), seqs, opts...)
	if lastStats.Pipelined != 0 || lastStats.Steps == 0 {
		t.Errorf("%d steps, %d ahead", lastStats.Steps, lastStats.Pipelined)
	}
}

// TestPipelineFailedOpen: a sequence whose asynchronous open fails (its
// prompt is longer than the context) ends with the open's error, while
// the step its first chunk was sent in runs for the others.
func TestPipelineFailedOpen(t *testing.T) {
	var seqs []*batcher.Sequence
	for i := range 24 {
		n := 10 + i
		if i%5 == 2 {
			n = 300 // past the 256-token context
		}
		seqs = append(seqs, &batcher.Sequence{Prompt: prompt(i, n), MaxTokens: 3 + i%7, IgnoreEOS: true}) // lengths apart: admissions behind pending steps
	}
	simOpts := []enginetest.SimOption{enginetest.WithContextLength(256), enginetest.WithStepTime(time.Millisecond, 0)}
	want := runQueued(t, simOpts, cloneSeqs(seqs), batcher.WithPipeline(false), batcher.WithMaxBatch(6))
	got := runQueued(t, simOpts, cloneSeqs(seqs), batcher.WithMaxBatch(6))
	if lastStats.Pipelined == 0 {
		t.Fatal("no step was sent ahead")
	}
	for i := range seqs {
		if i%5 == 2 {
			if !errors.Is(got[i].err, engine.ErrContextLength) || !errors.Is(want[i].err, engine.ErrContextLength) {
				t.Errorf("request %d: errors %v / %v, want context length exceeded", i, want[i].err, got[i].err)
			}
			continue
		}
		if got[i].err != nil || !slices.Equal(got[i].tokens, want[i].tokens) {
			t.Errorf("request %d: %v (err %v), want %v", i, got[i].tokens, got[i].err, want[i].tokens)
		}
	}
}

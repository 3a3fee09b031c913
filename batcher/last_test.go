package batcher_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// lastRecorder wraps a simulated model and records, per sequence, the
// Last flag of every input that samples, synchronous steps and
// pipelined ones alike (pipelined: StepAsync is forwarded).
type lastRecorder struct {
	engine.Model
	mu   sync.Mutex
	last map[engine.SeqID][]bool
}

func (r *lastRecorder) note(batch []engine.StepInput) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, in := range batch {
		if in.Sample {
			r.last[in.Seq] = append(r.last[in.Seq], in.Last)
		}
	}
}

func (r *lastRecorder) Step(ctx context.Context, batch []engine.StepInput) ([]engine.StepOutput, error) {
	r.note(batch)
	return r.Model.Step(ctx, batch)
}

// pipelinedRecorder is lastRecorder with the simulated model's
// pipelining and block pool.
type pipelinedRecorder struct{ *lastRecorder }

func (r pipelinedRecorder) FreeBlocks() int { return r.Model.(engine.BlockPool).FreeBlocks() }

func (r pipelinedRecorder) OpenAsync(ctx context.Context, id engine.SeqID, prompt []int32, key string) (engine.PendingOpen, bool) {
	return r.Model.(engine.Pipeliner).OpenAsync(ctx, id, prompt, key)
}

func (r pipelinedRecorder) StepAsync(ctx context.Context, batch []engine.StepInput) (engine.PendingStep, bool, error) {
	r.note(batch)
	return r.Model.(engine.Pipeliner).StepAsync(ctx, batch)
}

// TestLastSample: every sequence's sampling inputs carry
// engine.StepInput.Last on its last token only — MaxTokens reached (one
// token: its prompt's last chunk), or the context — in synchronous and
// pipelined steps, with prompts chunked beside decodes.
func TestLastSample(t *testing.T) {
	for _, pipelined := range []bool{false, true} {
		sim, m := simModel(t, enginetest.WithContextLength(96), enginetest.WithStepTime(100*time.Microsecond, 0))
		rec := &lastRecorder{Model: m, last: map[engine.SeqID][]bool{}}
		var model engine.Model = rec
		if pipelined {
			model = pipelinedRecorder{rec}
		}
		r := newRigModel(t, sim, model, nil, batcher.WithTokenBudget(24), batcher.WithMaxBatch(8))
		cases := []struct{ prompt, max, want int }{
			{10, 1, 1}, {30, 2, 2}, {5, 7, 7}, {50, 17, 17}, {80, 40, 16}, // the last: 96 - 80 tokens of context
			{3, 1, 1}, {40, 9, 9},
		}
		seqs := make([]*batcher.Sequence, len(cases))
		for i, c := range cases {
			seqs[i] = &batcher.Sequence{Prompt: prompt(i+1, c.prompt), MaxTokens: c.max, IgnoreEOS: true}
			r.submit(t, seqs[i])
		}
		got := map[int]int{}
		for i, s := range seqs {
			res := collect(s)
			if res.err != nil {
				t.Fatalf("pipelined=%v seq %d: %v", pipelined, i, res.err)
			}
			got[i] = len(res.tokens)
		}
		rec.mu.Lock()
		if len(rec.last) != len(cases) {
			t.Errorf("pipelined=%v: %d sequences sampled, want %d", pipelined, len(rec.last), len(cases))
		}
		tokens, samples := 0, 0
		for i, c := range cases {
			if got[i] != c.want {
				t.Errorf("pipelined=%v case %d: %d tokens, want %d", pipelined, i, got[i], c.want)
			}
			tokens += got[i]
		}
		for id, flags := range rec.last {
			samples += len(flags)
			if len(flags) == 0 || !flags[len(flags)-1] {
				t.Errorf("pipelined=%v seq %d: its last sample not marked Last: %v", pipelined, id, flags)
				continue
			}
			for k, l := range flags[:len(flags)-1] {
				if l {
					t.Errorf("pipelined=%v seq %d: sample %d of %d marked Last: %v", pipelined, id, k+1, len(flags), flags)
				}
			}
		}
		if samples != tokens { // a length stop runs no row for nothing
			t.Errorf("pipelined=%v: %d samples for %d tokens", pipelined, samples, tokens)
		}
		if pipelined && sim.Stats().Pipelined == 0 {
			t.Errorf("no step was pipelined")
		}
		rec.mu.Unlock()
	}
}

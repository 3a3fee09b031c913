package batcher_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
)

// partialSteps wraps a simulated pipelining model to answer as a model
// of two workers does when one is short of blocks: every period-th step
// of two inputs or more runs its even-numbered inputs only (the
// sequences on the worker with room) and leaves the others unchanged,
// returning an *engine.PartialStepError for want of memory; a step sent
// behind it (StepAsync) does not run the inputs of the sequences it left
// (engine.ErrNotRun there) and runs the others.
type partialSteps struct {
	engine.Model
	period int
	n      int
	prev   *partialPending // the partial step sent last, while not waited for
	// partial counts the steps run in part; behind those sent behind one
	// that ran in part and did not run wholly.
	partial, behind int
	inputs          int // inputs run, whole steps' and partial ones' alike
}

type partialPending struct {
	w    *partialSteps
	p    engine.PendingStep // the inner step of the inputs that ran; nil: none
	ran  []bool
	left map[engine.SeqID]bool // the sequences on the worker that did not run: this step's and the one's before
	err  error
}

func (pp *partialPending) Wait(ctx context.Context) ([]engine.StepOutput, error) {
	if pp.w.prev == pp {
		pp.w.prev = nil
	}
	if pp.p == nil {
		return nil, pp.err
	}
	outs, err := pp.p.Wait(ctx)
	if err != nil {
		return nil, err
	}
	return nil, &engine.PartialStepError{Ran: pp.ran, Outputs: outs, Err: pp.err}
}

func (w *partialSteps) FreeBlocks() int { return w.Model.(engine.BlockPool).FreeBlocks() }

func (w *partialSteps) OpenAsync(ctx context.Context, id engine.SeqID, prompt []int32, key string) (engine.PendingOpen, bool) {
	return w.Model.(engine.Pipeliner).OpenAsync(ctx, id, prompt, key)
}

// pick says which inputs of batch run: nil when all do.
func (w *partialSteps) pick(batch []engine.StepInput) []bool {
	if len(batch) < 2 {
		return nil
	}
	if w.n++; w.n%w.period != 0 {
		return nil
	}
	ran := make([]bool, len(batch))
	for i := range ran {
		ran[i] = i%2 == 0
	}
	return ran
}

// kept is the inputs of batch that run.
func kept(batch []engine.StepInput, ran []bool) []engine.StepInput {
	var out []engine.StepInput
	for i := range batch {
		if ran[i] {
			out = append(out, batch[i])
		}
	}
	return out
}

func (w *partialSteps) Step(ctx context.Context, batch []engine.StepInput) ([]engine.StepOutput, error) {
	ran := w.pick(batch)
	if ran == nil {
		w.inputs += len(batch)
		return w.Model.Step(ctx, batch)
	}
	outs, err := w.Model.Step(ctx, kept(batch, ran))
	if err != nil {
		return nil, err
	}
	w.partial++
	w.inputs += len(kept(batch, ran))
	return nil, &engine.PartialStepError{Ran: ran, Outputs: outs, Err: fmt.Errorf("worker 1: %w", engine.ErrOutOfMemory)}
}

func (w *partialSteps) StepAsync(ctx context.Context, batch []engine.StepInput) (engine.PendingStep, bool, error) {
	pl := w.Model.(engine.Pipeliner)
	pp := &partialPending{w: w, left: map[engine.SeqID]bool{}}
	if prev := w.prev; prev != nil { // behind a step that ran in part
		pp.err = fmt.Errorf("worker 1: %w", engine.ErrNotRun)
		pp.ran = make([]bool, len(batch))
		for i := range batch {
			pp.ran[i] = !prev.left[batch[i].Seq]
		}
		if !slices.Contains(pp.ran, false) {
			w.prev = nil
			return w.whole(ctx, batch)
		}
		for seq := range prev.left {
			pp.left[seq] = true
		}
		w.behind++
	} else if pp.ran = w.pick(batch); pp.ran == nil {
		return w.whole(ctx, batch)
	} else {
		pp.err = fmt.Errorf("worker 1: %w", engine.ErrOutOfMemory)
		w.partial++
	}
	for i := range batch {
		if !pp.ran[i] {
			pp.left[batch[i].Seq] = true
		}
	}
	if sub := kept(batch, pp.ran); len(sub) > 0 {
		p, ok, err := pl.StepAsync(ctx, sub)
		if err != nil || !ok {
			return p, ok, err
		}
		pp.p = p
		w.inputs += len(sub)
	}
	w.prev = pp
	return pp, true, nil
}

// whole sends batch whole behind the pending step.
func (w *partialSteps) whole(ctx context.Context, batch []engine.StepInput) (engine.PendingStep, bool, error) {
	p, ok, err := w.Model.(engine.Pipeliner).StepAsync(ctx, batch)
	if ok && err == nil {
		w.inputs += len(batch)
	}
	return p, ok, err
}

// TestStepsRunInPart: on a model whose steps now and then run in part
// (as with two workers, one short of blocks), every stream is what it
// is on a model that runs each step whole, token for token, pipelined or
// not: the inputs that ran are delivered once, the others step again.
func TestStepsRunInPart(t *testing.T) {
	for seed := uint64(200); seed < 215; seed++ {
		seqs, simOpts, opts := pipelineWorkload(seed, false)
		want := runQueued(t, simOpts, cloneSeqs(seqs), append(opts, batcher.WithPipeline(false))...)
		for _, pipe := range []bool{false, true} {
			var w *partialSteps
			wrap := func(m engine.Model) engine.Model {
				w = &partialSteps{Model: m, period: 3}
				return w
			}
			got := runWrapped(t, simOpts, wrap, cloneSeqs(seqs), append(opts, batcher.WithPipeline(pipe))...)
			for i := range got {
				if got[i].err != nil || !slices.Equal(got[i].tokens, want[i].tokens) || got[i].finish != want[i].finish {
					t.Fatalf("seed %d pipe=%v request %d: %v %q %v; run whole: %v %q %v", seed, pipe, i, got[i].tokens, got[i].finish, got[i].err, want[i].tokens, want[i].finish, want[i].err)
				}
			}
			if lastStats.Inputs != uint64(w.inputs) {
				t.Errorf("seed %d pipe=%v: the batcher counted %d inputs; the engine ran %d (steps run in part counted as far as they ran)", seed, pipe, lastStats.Inputs, w.inputs)
			}
			if lastStats.PartialSteps == 0 || pipe && w.behind == 0 {
				t.Errorf("seed %d pipe=%v: %d steps run in part, %d sent behind them; the batcher counted %d: the test did not run its case", seed, pipe, w.partial, w.behind, lastStats.PartialSteps)
			}
		}
	}
}

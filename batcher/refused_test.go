package batcher_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/scheduler"
)

// shortWorker wraps a simulated pipelining model as a model of several
// workers, one of which holds the sequences opened with prompts a and b
// and has no room for both to grow: it refuses, changing nothing
// (engine.ErrOutOfMemory), every step that feeds both, and does not run
// a step sent behind a refused one (engine.ErrNotRun). The model's free
// blocks, the pools' sum, leave the batcher room; a sequence it preempts
// is admitted again, and routed to the same worker.
type shortWorker struct {
	engine.Model
	a, b []int32

	mu      sync.Mutex
	ids     map[engine.SeqID]byte // 'a' or 'b': which prompt the sequence was opened with
	refused *failedStep           // the refused step, until waited for
	n       int                   // steps refused
}

func (w *shortWorker) note(id engine.SeqID, prompt []int32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case len(prompt) >= len(w.a) && slices.Equal(prompt[:len(w.a)], w.a):
		w.ids[id] = 'a'
	case len(prompt) >= len(w.b) && slices.Equal(prompt[:len(w.b)], w.b):
		w.ids[id] = 'b'
	}
}

// refuses reports whether batch feeds both sequences.
func (w *shortWorker) refuses(batch []engine.StepInput) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	var seen [2]bool
	for _, in := range batch {
		switch w.ids[in.Seq] {
		case 'a':
			seen[0] = true
		case 'b':
			seen[1] = true
		}
	}
	if seen[0] && seen[1] {
		w.n++
		return true
	}
	return false
}

func (w *shortWorker) Open(ctx context.Context, id engine.SeqID, prompt []int32, key string) (int, error) {
	w.note(id, prompt)
	return w.Model.Open(ctx, id, prompt, key)
}

func (w *shortWorker) OpenAsync(ctx context.Context, id engine.SeqID, prompt []int32, key string) (engine.PendingOpen, bool) {
	w.note(id, prompt)
	return w.Model.(engine.Pipeliner).OpenAsync(ctx, id, prompt, key)
}

func (w *shortWorker) FreeBlocks() int { return w.Model.(engine.BlockPool).FreeBlocks() }

func (w *shortWorker) Step(ctx context.Context, batch []engine.StepInput) ([]engine.StepOutput, error) {
	if w.refuses(batch) {
		return nil, fmt.Errorf("worker 1: %w", engine.ErrOutOfMemory)
	}
	return w.Model.Step(ctx, batch)
}

func (w *shortWorker) StepAsync(ctx context.Context, batch []engine.StepInput) (engine.PendingStep, bool, error) {
	if w.refused != nil && !w.refused.waited {
		return &failedStep{err: fmt.Errorf("worker 1: %w", engine.ErrNotRun)}, true, nil
	}
	if w.refuses(batch) {
		w.refused = &failedStep{err: fmt.Errorf("worker 1: %w", engine.ErrOutOfMemory)}
		return w.refused, true, nil
	}
	return w.Model.(engine.Pipeliner).StepAsync(ctx, batch)
}

// runRefused runs seqs on the simulated model as wrap wraps it, and
// returns their streams, or fails t when they do not all end within 10
// seconds.
func runRefused(t *testing.T, wrap func(engine.Model) engine.Model, seqs []*batcher.Sequence, opts ...batcher.Option) []result {
	t.Helper()
	sim, m := simModel(t, enginetest.WithBlockSize(16), enginetest.WithKVCapacity(64*16), enginetest.WithContextLength(512), enginetest.WithStepTime(100*time.Microsecond, 0))
	r := newRigModel(t, sim, wrap(m), []scheduler.Option{scheduler.WithPreemption(true)}, opts...)
	ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	out := make([]result, len(seqs))
	var wg sync.WaitGroup
	for i, s := range seqs {
		r.submit(t, s)
		wg.Go(func() { out[i] = collectWith(ctx, s, nil) })
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("the streams did not end: %d steps, %d block preemptions", r.b.Stats().Steps, r.b.Stats().BlockPreemptions)
	}
	return out
}

// TestRefusedStepsOfOneWorker: a worker keeps refusing the steps that
// feed two of its sequences together, while the model's free blocks (the
// pools' sum) leave the batcher room. Preempting a sequence gives the
// worker its blocks; admitted again at once, routed to the same worker,
// it would be refused with the other at every step, neither ever
// stepping. Admission waits for a step to run whole after a refusal, so
// the other steps alone in between: both streams end, each as it is
// alone, pipelined or not.
func TestRefusedStepsOfOneWorker(t *testing.T) {
	for _, pipe := range []bool{false, true} {
		t.Run(fmt.Sprint("pipe=", pipe), func(t *testing.T) {
			a, b := prompt(1, 20), prompt(2, 30)
			var w *shortWorker
			wrap := func(m engine.Model) engine.Model {
				w = &shortWorker{Model: m, a: a, b: b, ids: map[engine.SeqID]byte{}}
				return w
			}
			seqs := []*batcher.Sequence{{Prompt: a, MaxTokens: 12, IgnoreEOS: true}, {Prompt: b, MaxTokens: 12, IgnoreEOS: true}}
			got := runRefused(t, wrap, seqs, batcher.WithPipeline(pipe))
			for i, s := range seqs {
				if want := alone(t, s.Prompt, s.MaxTokens); got[i].err != nil || !slices.Equal(got[i].tokens, want) {
					t.Errorf("request %d: %v (err %v), alone %v", i, got[i].tokens, got[i].err, want)
				}
			}
			if w.n == 0 {
				t.Error("no step was refused: the test did not run its case")
			}
		})
	}
}

// leftBehind wraps a simulated pipelining model: armed, it refuses
// (engine.ErrOutOfMemory, changing nothing) the first step sent that
// feeds the sequence opened with prompt keep while the one opened with
// prompt gone is open and not in it — gone has sampled its last token in
// the pending step, and its free comes behind this one, so the worker
// still holds its blocks — and does not run the step sent behind it
// (engine.ErrNotRun).
type leftBehind struct {
	engine.Model
	keep, gone []int32

	mu      sync.Mutex
	ids     map[engine.SeqID][]int32 // open sequences' prompts
	armed   bool
	refused *failedStep
}

func (w *leftBehind) Open(ctx context.Context, id engine.SeqID, prompt []int32, key string) (int, error) {
	w.note(id, prompt)
	return w.Model.Open(ctx, id, prompt, key)
}

func (w *leftBehind) OpenAsync(ctx context.Context, id engine.SeqID, prompt []int32, key string) (engine.PendingOpen, bool) {
	w.note(id, prompt)
	return w.Model.(engine.Pipeliner).OpenAsync(ctx, id, prompt, key)
}

func (w *leftBehind) note(id engine.SeqID, prompt []int32) {
	w.mu.Lock()
	w.ids[id] = prompt
	w.mu.Unlock()
}

func (w *leftBehind) Free(id engine.SeqID, key string) {
	w.mu.Lock()
	delete(w.ids, id)
	w.mu.Unlock()
	w.Model.Free(id, key)
}

func (w *leftBehind) FreeBlocks() int { return w.Model.(engine.BlockPool).FreeBlocks() }

func (w *leftBehind) StepAsync(ctx context.Context, batch []engine.StepInput) (engine.PendingStep, bool, error) {
	if w.refused != nil && !w.refused.waited {
		return &failedStep{err: fmt.Errorf("behind: %w", engine.ErrNotRun)}, true, nil
	}
	w.mu.Lock()
	feeds := func(p []int32) bool {
		return slices.ContainsFunc(batch, func(in engine.StepInput) bool { return slices.Equal(w.ids[in.Seq], p) })
	}
	open := slices.ContainsFunc(slices.Collect(mapValues(w.ids)), func(p []int32) bool { return slices.Equal(p, w.gone) })
	fire := w.armed && feeds(w.keep) && open && !feeds(w.gone)
	if fire {
		w.armed = false
	}
	w.mu.Unlock()
	if fire {
		w.refused = &failedStep{err: fmt.Errorf("injected: %w", engine.ErrOutOfMemory)}
		return w.refused, true, nil
	}
	return w.Model.(engine.Pipeliner).StepAsync(ctx, batch)
}

func mapValues[K comparable, V any](m map[K]V) func(func(V) bool) {
	return func(yield func(V) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

// TestPipelineRefusedLoneSurvivor: a pipelined step feeding one sequence
// is refused for want of blocks that another held when it was sent — one
// that sampled its last token in the step before, its free sent behind
// the refused step. By the refusal's delivery the other has left: the one
// left steps again and ends as it does alone, where it used to fail with
// the refusal's error, as a sequence alone that the pool cannot hold.
func TestPipelineRefusedLoneSurvivor(t *testing.T) {
	keep, gone := prompt(1, 20), prompt(2, 20)
	var w *leftBehind
	wrap := func(m engine.Model) engine.Model {
		w = &leftBehind{Model: m, keep: keep, gone: gone, ids: map[engine.SeqID][]int32{}, armed: true}
		return w
	}
	seqs := []*batcher.Sequence{{Prompt: keep, MaxTokens: 12, IgnoreEOS: true}, {Prompt: gone, MaxTokens: 3, IgnoreEOS: true}}
	got := runRefused(t, wrap, seqs)
	for i, s := range seqs {
		if want := alone(t, s.Prompt, s.MaxTokens); got[i].err != nil || !slices.Equal(got[i].tokens, want) {
			t.Errorf("request %d: %v (err %v), alone %v", i, got[i].tokens, got[i].err, want)
		}
	}
	if w.armed {
		t.Error("no step was refused: the test did not run its case")
	}
}

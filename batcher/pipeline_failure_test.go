package batcher_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// oomCounter counts the batcher's "engine out of blocks" debug lines.
type oomCounter struct{ n atomic.Int64 }

func (c *oomCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *oomCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "engine out of blocks: preempting" {
		c.n.Add(1)
	}
	return nil
}
func (c *oomCounter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *oomCounter) WithGroup(string) slog.Handler      { return c }

// TestPipelinedChunksFitThePool: long prompts prefilled in chunks
// not aligned to blocks, beside decodes, on a tight pool: a chunk planned
// behind a pending chunk of the same sequence must fit the blocks left.
func TestPipelinedChunksFitThePool(t *testing.T) {
	for _, pipe := range []bool{false, true} {
		var total int64
		for seed := range uint64(20) {
			rng := rand.New(rand.NewPCG(seed, 7))
			seqs := make([]*batcher.Sequence, 12)
			for i := range seqs {
				seqs[i] = &batcher.Sequence{Prompt: prompt(int(seed)*100+i, 60+rng.IntN(120)), MaxTokens: 10 + rng.IntN(40), IgnoreEOS: true}
			}
			c := &oomCounter{}
			simOpts := []enginetest.SimOption{enginetest.WithBlockSize(16), enginetest.WithKVCapacity(24 * 16), enginetest.WithContextLength(24 * 16)}
			res := runQueued(t, simOpts, seqs, batcher.WithPipeline(pipe), batcher.WithTokenBudget(21+rng.IntN(10)), batcher.WithMaxBatch(6), batcher.WithLogger(slog.New(c)))
			for i, r := range res {
				if r.err != nil {
					t.Fatalf("pipe=%v seed %d request %d: %v", pipe, seed, i, r.err)
				}
			}
			total += c.n.Load()
		}
		t.Logf("pipe=%v: %d steps refused for want of blocks", pipe, total)
		if total > 0 {
			t.Errorf("pipe=%v: %d steps the batcher planned were refused for want of blocks (ErrOutOfMemory)", pipe, total)
		}
	}
}

// oomOnOpening wraps a simulated pipelining model: armed, it refuses the
// first step sent with an Opening input with ErrOutOfMemory (changing
// nothing, as engine.BlockPool says), and the step sent behind it with
// ErrNotRun.
type oomOnOpening struct {
	engine.Model
	armed    atomic.Bool
	injected *failedStep
}

type failedStep struct {
	err    error
	waited bool
}

func (f *failedStep) Wait(context.Context) ([]engine.StepOutput, error) {
	f.waited = true
	return nil, f.err
}

func (w *oomOnOpening) FreeBlocks() int { return w.Model.(engine.BlockPool).FreeBlocks() }

func (w *oomOnOpening) OpenAsync(ctx context.Context, id engine.SeqID, prompt []int32, key string) (engine.PendingOpen, bool) {
	return w.Model.(engine.Pipeliner).OpenAsync(ctx, id, prompt, key)
}

func (w *oomOnOpening) StepAsync(ctx context.Context, batch []engine.StepInput) (engine.PendingStep, bool, error) {
	if w.injected != nil && !w.injected.waited {
		return &failedStep{err: fmt.Errorf("behind: %w", engine.ErrNotRun)}, true, nil
	}
	if w.armed.Load() && slices.ContainsFunc(batch, func(in engine.StepInput) bool { return in.Opening }) {
		w.armed.Store(false)
		w.injected = &failedStep{err: fmt.Errorf("injected: %w", engine.ErrOutOfMemory)}
		return w.injected, true, nil
	}
	return w.Model.(engine.Pipeliner).StepAsync(ctx, batch)
}

// TestPipelineRefusedOpeningChunk: a step carrying the first chunk of a
// sequence whose asynchronous open reused a saved prefix is refused for
// want of blocks after the open was answered; the sequence must go on
// from the prefix the engine holds.
func TestPipelineRefusedOpeningChunk(t *testing.T) {
	sim, m := simModel(t, enginetest.WithBlockSize(16), enginetest.WithKVCapacity(64*16), enginetest.WithContextLength(512), enginetest.WithStepTime(200*time.Microsecond, 0))
	w := &oomOnOpening{Model: m}
	r := newRigModel(t, sim, w, nil, batcher.WithTokenBudget(64))
	push := func(s *batcher.Sequence) { r.submit(t, s) }
	base := prompt(1, 100)
	a := &batcher.Sequence{Prompt: base, MaxTokens: 2, IgnoreEOS: true, SaveKey: "k"}
	long := &batcher.Sequence{Prompt: prompt(2, 20), MaxTokens: 300, IgnoreEOS: true} // keeps steps pipelined
	push(long)
	push(a)
	if res := collect(a); res.err != nil {
		t.Fatal(res.err)
	}
	w.armed.Store(true)
	pb := append(slices.Clip(base), prompt(3, 40)...)
	bseq := &batcher.Sequence{Prompt: pb, MaxTokens: 5, IgnoreEOS: true, PrefixKey: "k"}
	dseq := &batcher.Sequence{Prompt: prompt(4, 150), MaxTokens: 5, IgnoreEOS: true} // the victim of the preemption
	push(bseq)
	push(dseq)
	got := collect(bseq)
	collect(dseq)
	long.Cancel(nil)
	if w.armed.Load() {
		t.Fatal("no step with an Opening input was refused: the test did not run its case")
	}
	if want := alone(t, pb, 5); got.err != nil || !slices.Equal(got.tokens, want) {
		t.Fatalf("prefix-reusing sequence: %v (err %v), alone %v", got.tokens, got.err, want)
	}
}

// TestPipelinedMatchesSynchronousWithPrefixes: as
// TestPipelinedMatchesSynchronous, with sequences saving their KV under
// keys others reuse (first chunks behind opens that reused a prefix) and
// a step time, so steps are pending while sequences finish.
func TestPipelinedMatchesSynchronousWithPrefixes(t *testing.T) {
	for seed := uint64(100); seed < 130; seed++ {
		seqs, simOpts, opts := pipelineWorkload(seed, false)
		keys := func(ss []*batcher.Sequence) []*batcher.Sequence {
			for i, s := range ss {
				if i%3 == 0 {
					s.SaveKey = fmt.Sprintf("k%d", i%5)
				}
				if i%4 == 1 {
					s.PrefixKey = fmt.Sprintf("k%d", (i+1)%5)
				}
			}
			return ss
		}
		simOpts = append(simOpts, enginetest.WithStepTime(50*time.Microsecond, 0))
		want := runQueued(t, simOpts, keys(cloneSeqs(seqs)), append(opts, batcher.WithPipeline(false))...)
		got := runQueued(t, simOpts, keys(cloneSeqs(seqs)), opts...)
		for i := range got {
			if got[i].err != nil || want[i].err != nil || !slices.Equal(got[i].tokens, want[i].tokens) || got[i].finish != want[i].finish {
				t.Fatalf("seed %d request %d: %v %q %v, sync %v %q %v", seed, i, got[i].tokens, got[i].finish, got[i].err, want[i].tokens, want[i].finish, want[i].err)
			}
		}
	}
}

// cancelInWait wraps a simulated pipelining model: the step carrying a
// sampling row of exactly watch prompt tokens pushes next into the queue,
// and waiting for that step cancels target first — a cancellation that
// lands after the loop reaped cancelled sequences and before the step's
// delivery.
type cancelInWait struct {
	engine.Model
	watch  int
	target *batcher.Sequence
	next   func()
	fired  atomic.Bool
}

type cancelFirst struct {
	engine.PendingStep
	cancel func()
}

func (c *cancelFirst) Wait(ctx context.Context) ([]engine.StepOutput, error) {
	c.cancel()
	return c.PendingStep.Wait(ctx)
}

func (w *cancelInWait) FreeBlocks() int { return w.Model.(engine.BlockPool).FreeBlocks() }

func (w *cancelInWait) OpenAsync(ctx context.Context, id engine.SeqID, prompt []int32, key string) (engine.PendingOpen, bool) {
	return w.Model.(engine.Pipeliner).OpenAsync(ctx, id, prompt, key)
}

func (w *cancelInWait) StepAsync(ctx context.Context, batch []engine.StepInput) (engine.PendingStep, bool, error) {
	p, ok, err := w.Model.(engine.Pipeliner).StepAsync(ctx, batch)
	if err != nil || !ok || w.fired.Load() || !slices.ContainsFunc(batch, func(in engine.StepInput) bool { return in.Sample && len(in.Tokens) == w.watch }) {
		return p, ok, err
	}
	w.fired.Store(true)
	w.next()
	return &cancelFirst{PendingStep: p, cancel: func() { w.target.Cancel(context.Canceled) }}, true, nil
}

// TestPipelineCancelledWhileLastChunkPending: a sequence is cancelled
// while the step with its last prompt chunk is pending, and that step is
// delivered by an admission that must wait for it (an open that cannot
// be sent asynchronously) rather than at the loop's top. Its prompt is
// then fed with no token sampled; the next plan must not step it.
func TestPipelineCancelledWhileLastChunkPending(t *testing.T) {
	sim, m := simModel(t, enginetest.WithBlockSize(16), enginetest.WithKVCapacity(64*16), enginetest.WithContextLength(512), enginetest.WithStepTime(200*time.Microsecond, 0))
	target := &batcher.Sequence{Prompt: prompt(2, 37), MaxTokens: 5, IgnoreEOS: true}
	w := &cancelInWait{Model: m, watch: len(target.Prompt), target: target}
	r := newRigModel(t, sim, w, nil, batcher.WithTokenBudget(64))
	// An adapter's open is never sent asynchronously; the simulated model
	// serves none, so it fails after the admission waited.
	sync := &batcher.Sequence{Prompt: prompt(3, 20), MaxTokens: 5, IgnoreEOS: true, Adapter: "none"}
	w.next = func() { r.submit(t, sync) }
	long := &batcher.Sequence{Prompt: prompt(1, 20), MaxTokens: 300, IgnoreEOS: true} // keeps steps pipelined
	r.submit(t, long)
	time.Sleep(5 * time.Millisecond)
	r.submit(t, target)
	if res := collect(target); !errors.Is(res.err, context.Canceled) {
		t.Fatalf("cancelled sequence: tokens %v, err %v; want context.Canceled", res.tokens, res.err)
	}
	if res := collect(sync); res.err == nil {
		t.Fatal("a sequence asking for an adapter the model does not serve succeeded")
	}
	long.Cancel(nil)
	collect(long)
	if !w.fired.Load() {
		t.Fatal("no step carried the watched prompt: the test did not run its case")
	}
}

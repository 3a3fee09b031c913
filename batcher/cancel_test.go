package batcher_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/batcher/batchertest"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/scheduler"
)

// errCancelled is what the test cancels streams with: a cancelled stream
// that ends with another error did not end by its cancellation.
var errCancelled = errors.New("cancelled by the test")

// cancelWorkload is a random mix of requests arriving over time on a
// paged pool small enough to preempt: prompts long enough to be prefilled
// in chunks, some sharing a prefix another saved, all tiers; some whose
// open must wait for the pending step (an adapter the model does not
// serve, a constraint), often queued right behind a step that carries a
// prompt's last chunk; and cancellations at every point of a request's
// life.
func cancelWorkload(seed uint64) ([]*batchertest.Case, []enginetest.SimOption, []batcher.Option) {
	rng := rand.New(rand.NewPCG(seed, 53))
	tiers := []api.Tier{api.Critical, api.Normal, api.Background}
	bs := []int{8, 16}[rng.IntN(2)]
	ctxLen := (10 + rng.IntN(24)) * bs
	cases := make([]*batchertest.Case, 40+rng.IntN(30))
	for i := range cases {
		p := prompt(int(seed)*1000+i, 1+rng.IntN(min(ctxLen/2, 120)))
		s := &batcher.Sequence{IgnoreEOS: true, Tier: tiers[rng.IntN(3)]}
		if rng.IntN(2) == 0 {
			s.SaveKey = fmt.Sprint("k", i)
		}
		if i > 0 && rng.IntN(3) == 0 { // goes on from an earlier prompt
			j := rng.IntN(i)
			prev := cases[j].Seq.Prompt
			p = append(slices.Clone(prev[:rng.IntN(len(prev)+1)]), p...)
			p = p[:min(len(p), ctxLen/2)]
			s.PrefixKey = fmt.Sprint("k", j)
		}
		s.Prompt, s.MaxTokens = p, 1+rng.IntN(min(ctxLen-len(p), 40))
		c := &batchertest.Case{Seq: s}
		switch k := rng.IntN(20); {
		case k < 6:
			s.Adapter = "none" // fails after the admission waited for the pending step
			c.BehindStep = rng.IntN(3) != 0
		case k == 6:
			s.Constraint = batchertest.AllowAll{}
			c.BehindStep = rng.IntN(2) == 0
		}
		if rng.IntN(2) == 0 {
			c.Gap = time.Duration(rng.IntN(1500)) * time.Microsecond
		}
		switch k := rng.IntN(15); {
		case k < 4:
			c.Mode = batchertest.Kept
		case k == 4:
			c.Mode = batchertest.BeforeQueue
		case k == 5:
			c.Mode = batchertest.Queued
		case k < 8:
			c.Mode = batchertest.AfterDelay
			c.Delay = time.Duration(rng.IntN(4000)) * time.Microsecond
		case k < 10:
			c.Mode = batchertest.AfterTokens
			c.Tokens = 1 + rng.IntN(s.MaxTokens)
		case k < 14:
			c.Mode = batchertest.AtLastChunk
			c.AtSend = rng.IntN(4) == 0
		default:
			c.Mode = batchertest.AtOpen
		}
		cases[i] = c
	}
	sim := []enginetest.SimOption{enginetest.WithBlockSize(bs), enginetest.WithKVCapacity(ctxLen), enginetest.WithContextLength(ctxLen),
		enginetest.WithStepTime(200*time.Microsecond, 2*time.Microsecond)}
	maxBatch := 3 + rng.IntN(12)
	opts := []batcher.Option{batcher.WithMaxBatch(maxBatch), batcher.WithTokenBudget(max(maxBatch, 16+rng.IntN(32)))}
	return cases, sim, opts
}

// TestCancelAnywhere runs random workloads, pipelined and not, in which
// requests are cancelled at random points of their lives: before they are
// queued, while queued, at a random moment, when the step with their last
// prompt chunk is sent or waited for (also by an admission that must wait
// for it), and from their readers after some tokens. No stream may hang or
// get a token it does not get alone; one not cancelled gets every token it
// gets alone; and once all have ended the batcher and the engine hold
// nothing (no sequence left open, no block leaked).
func TestCancelAnywhere(t *testing.T) {
	for _, pipe := range []bool{true, false} {
		for seed := range uint64(6) {
			t.Run(fmt.Sprintf("pipe=%v/seed=%d", pipe, seed), func(t *testing.T) {
				runCancelWorkload(t, seed, pipe)
			})
		}
	}
}

func runCancelWorkload(t *testing.T, seed uint64, pipe bool) {
	cases, simOpts, opts := cancelWorkload(seed)
	sim, m := simModel(t, simOpts...)
	w := &lastChunkModel{pagedModel: m.(pagedModel), Canceller: batchertest.NewCanceller(cases, errCancelled)}
	r := newRigModel(t, sim, w, []scheduler.Option{scheduler.WithPreemption(true)}, append(opts, batcher.WithPipeline(pipe))...)
	ctx, stop := context.WithTimeout(context.Background(), 30*time.Second) // a stream still open then hangs
	defer stop()
	results := make([]result, len(cases))
	push := func(s *batcher.Sequence) error {
		return r.queue.Push(&batcher.Entry{Value: s, Tier: s.Tier, Cost: len(s.Prompt) + s.MaxTokens})
	}
	w.Drive(ctx, cases, push, func(i int, c *batchertest.Case) { results[i] = readCancelling(ctx, c) },
		func(err error) { t.Errorf("queueing: %v", err) })

	for i, c := range cases {
		got, s := results[i], c.Seq
		name := fmt.Sprintf("request %d (%s, prompt %d, max %d, adapter %q)", i, c.Mode, len(s.Prompt), s.MaxTokens, s.Adapter)
		if errors.Is(got.err, context.DeadlineExceeded) {
			t.Fatalf("%s: the stream did not end (%d tokens)", name, len(got.tokens))
		}
		cancelled := c.Mode != batchertest.Kept
		if s.Adapter != "" {
			if len(got.tokens) > 0 || got.err == nil || (!cancelled && errors.Is(got.err, errCancelled)) {
				t.Errorf("%s: %d tokens, err %v; want none and an error", name, len(got.tokens), got.err)
			}
			continue
		}
		want := alone(t, s.Prompt, s.MaxTokens)
		switch {
		case !cancelled && (got.err != nil || got.finish != api.FinishLength || !slices.Equal(got.tokens, want)):
			t.Errorf("%s: %v, finish %q, err %v; alone %v", name, got.tokens, got.finish, got.err, want)
		case cancelled && !slices.Equal(got.tokens, want[:min(len(got.tokens), len(want))]):
			t.Errorf("%s: %v, not a prefix of the tokens it gets alone, %v", name, got.tokens, want)
		case cancelled && got.err == nil && (got.finish != api.FinishLength || len(got.tokens) != len(want)):
			t.Errorf("%s: ended without error after %d of %d tokens, finish %q", name, len(got.tokens), len(want), got.finish)
		case cancelled && got.err != nil && !errors.Is(got.err, errCancelled):
			t.Errorf("%s: ended with %v, not its cancellation", name, got.err)
		case c.Mode == batchertest.AfterTokens && len(got.tokens) < c.Tokens:
			t.Errorf("%s: cancelled after %d tokens, got %d", name, c.Tokens, len(got.tokens))
		}
	}
	preempted := 0
	for _, got := range results {
		if got.usage != nil {
			preempted += got.usage.Preemptions
		}
	}
	waitIdle(t, r, m)
	// Those that ask for no adapter run.
	eligible, fired := w.Fired(func(c *batchertest.Case) bool { return c.Seq.Adapter == "" })
	if fired[batchertest.AtLastChunk] == 0 && eligible[batchertest.AtLastChunk] > 0 {
		t.Errorf("none of the %d requests to cancel at their last prompt chunk was", eligible[batchertest.AtLastChunk])
	}
	st := r.b.Stats()
	t.Logf("%d requests (%d cancelled at their last chunk), %d steps (%d sent ahead, %d drains), %d block preemptions, %d preemptions of streams that finished",
		len(cases), fired[batchertest.AtLastChunk], st.Steps, st.Pipelined, st.Drains, st.BlockPreemptions, preempted)
}

// readCancelling reads c's stream to its end as collect does, cancelling
// the sequence once it received c.tokens tokens when c says so. It gives
// up when ctx ends (the result's err is then ctx's).
func readCancelling(ctx context.Context, c *batchertest.Case) result {
	return collectWith(ctx, c.Seq, func(n int) {
		if c.Mode == batchertest.AfterTokens && n == c.Tokens {
			c.Seq.Cancel(errCancelled)
		}
	})
}

// waitIdle waits for the batcher to run nothing and the engine to hold
// nothing — no sequence open, every block free — once every stream has
// ended, and fails t if they do not within a few seconds. The last
// pending step and the answers to opens of sequences freed before them
// are read on the loop's next turns, so it polls.
func waitIdle(t *testing.T, r *rig, m engine.Model) {
	t.Helper()
	pool, _ := m.(engine.BlockPool)
	info := m.Info()
	idle := func() (running, open, free int, ok bool) {
		running, open = r.b.Stats().Running, r.sim.Stats().OpenSequences
		free = info.KVBlocks
		if pool != nil && info.Paged() {
			free = pool.FreeBlocks()
		}
		return running, open, free, running == 0 && open == 0 && free == info.KVBlocks
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if _, _, _, ok := idle(); ok {
			return
		}
	}
	running, open, free, _ := idle()
	t.Errorf("after every stream ended: %d sequences running, %d open in the engine, %d of %d blocks free", running, open, free, info.KVBlocks)
}

// lastChunkModel wraps a simulated model and tells its Canceller of the
// opens and steps the batcher asks for (batchertest.Canceller).
type lastChunkModel struct {
	pagedModel
	*batchertest.Canceller
}

func (w *lastChunkModel) Open(ctx context.Context, id engine.SeqID, prompt []int32, key string) (int, error) {
	w.Opening(id, prompt)
	return w.pagedModel.Open(ctx, id, prompt, key)
}

func (w *lastChunkModel) OpenAsync(ctx context.Context, id engine.SeqID, prompt []int32, key string) (engine.PendingOpen, bool) {
	w.Opening(id, prompt)
	return w.pagedModel.(engine.Pipeliner).OpenAsync(ctx, id, prompt, key)
}

func (w *lastChunkModel) Step(ctx context.Context, in []engine.StepInput) ([]engine.StepOutput, error) {
	w.Sent(in, false)
	return w.pagedModel.Step(ctx, in)
}

func (w *lastChunkModel) StepAsync(ctx context.Context, in []engine.StepInput) (engine.PendingStep, bool, error) {
	p, ok, err := w.pagedModel.(engine.Pipeliner).StepAsync(ctx, in)
	if err != nil || !ok {
		return p, ok, err
	}
	atWait := w.Sent(in, true)
	if len(atWait) == 0 {
		return p, ok, nil
	}
	return &cancelFirst{PendingStep: p, cancel: func() { w.Cancel(atWait) }}, true, nil
}

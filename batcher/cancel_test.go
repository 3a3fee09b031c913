package batcher_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/scheduler"
)

// errCancelled is what the test cancels streams with: a cancelled stream
// that ends with another error did not end by its cancellation.
var errCancelled = errors.New("cancelled by the test")

// cancelMode is when a request of TestCancelAnywhere is cancelled.
type cancelMode int

const (
	notCancelled      cancelMode = iota
	cancelBeforeQueue            // before it is queued: never admitted
	cancelQueued                 // right after it is queued, most often still waiting
	cancelAfterDelay             // a random short time after it is queued, anywhere in its life
	cancelAfterTokens            // by its reader, once it received some tokens
	cancelAtLastChunk            // when the step with its last prompt chunk is sent or waited for (lastChunkModel)
	cancelAtOpen                 // when the engine is asked to open it (lastChunkModel)
)

func (m cancelMode) String() string {
	return [...]string{"not cancelled", "before queued", "while queued", "after a delay", "after tokens", "at its last chunk", "at its open"}[m]
}

// cancelCase is one request of a cancellation workload: when it arrives
// and when it is cancelled.
type cancelCase struct {
	seq    *batcher.Sequence
	mode   cancelMode
	gap    time.Duration // wait before it arrives, after the request before it
	delay  time.Duration // cancelAfterDelay: from its queueing to its cancellation
	tokens int           // cancelAfterTokens: tokens its reader receives first
	atSend bool          // cancelAtLastChunk: when the step is sent rather than waited for
	// behindStep: on arrival it waits to be queued until a step carrying
	// some prompt's last chunk is sent, so that an admission that cannot
	// open it asynchronously must wait for that step (lastChunkModel).
	behindStep bool
	fired      bool // cancelAtLastChunk, cancelAtOpen: lastChunkModel cancelled it (under its lock)
}

// allowAll is a Constraint that allows every token: a constrained
// sequence's open is never sent asynchronously and it makes every step it
// runs in synchronous, while its tokens stay those it gets alone.
type allowAll struct{}

func (allowAll) FillMask(mask []uint64) {
	for i := range mask {
		mask[i] = ^uint64(0)
	}
}
func (allowAll) Accept(int32) error { return nil }
func (allowAll) Done() bool         { return false }

// cancelWorkload is a random mix of requests arriving over time on a
// paged pool small enough to preempt: prompts long enough to be prefilled
// in chunks, some sharing a prefix another saved, all tiers; some whose
// open must wait for the pending step (an adapter the model does not
// serve, a constraint), often queued right behind a step that carries a
// prompt's last chunk; and cancellations at every point of a request's
// life.
func cancelWorkload(seed uint64) ([]*cancelCase, []enginetest.SimOption, []batcher.Option) {
	rng := rand.New(rand.NewPCG(seed, 53))
	tiers := []api.Tier{api.Critical, api.Normal, api.Background}
	bs := []int{8, 16}[rng.IntN(2)]
	ctxLen := (10 + rng.IntN(24)) * bs
	cases := make([]*cancelCase, 40+rng.IntN(30))
	for i := range cases {
		p := prompt(int(seed)*1000+i, 1+rng.IntN(min(ctxLen/2, 120)))
		s := &batcher.Sequence{IgnoreEOS: true, Tier: tiers[rng.IntN(3)]}
		if rng.IntN(2) == 0 {
			s.SaveKey = fmt.Sprint("k", i)
		}
		if i > 0 && rng.IntN(3) == 0 { // goes on from an earlier prompt
			j := rng.IntN(i)
			prev := cases[j].seq.Prompt
			p = append(slices.Clone(prev[:rng.IntN(len(prev)+1)]), p...)
			p = p[:min(len(p), ctxLen/2)]
			s.PrefixKey = fmt.Sprint("k", j)
		}
		s.Prompt, s.MaxTokens = p, 1+rng.IntN(min(ctxLen-len(p), 40))
		c := &cancelCase{seq: s}
		switch k := rng.IntN(20); {
		case k < 6:
			s.Adapter = "none" // fails after the admission waited for the pending step
			c.behindStep = rng.IntN(3) != 0
		case k == 6:
			s.Constraint = allowAll{}
			c.behindStep = rng.IntN(2) == 0
		}
		if rng.IntN(2) == 0 {
			c.gap = time.Duration(rng.IntN(1500)) * time.Microsecond
		}
		switch k := rng.IntN(15); {
		case k < 4:
			c.mode = notCancelled
		case k == 4:
			c.mode = cancelBeforeQueue
		case k == 5:
			c.mode = cancelQueued
		case k < 8:
			c.mode = cancelAfterDelay
			c.delay = time.Duration(rng.IntN(4000)) * time.Microsecond
		case k < 10:
			c.mode = cancelAfterTokens
			c.tokens = 1 + rng.IntN(s.MaxTokens)
		case k < 14:
			c.mode = cancelAtLastChunk
			c.atSend = rng.IntN(4) == 0
		default:
			c.mode = cancelAtOpen
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
	w := &lastChunkModel{pagedModel: m.(pagedModel), ids: map[engine.SeqID]*cancelCase{}, sampled: map[engine.SeqID]bool{}}
	for _, c := range cases {
		if c.mode == cancelAtLastChunk || c.mode == cancelAtOpen {
			w.cancelAt = append(w.cancelAt, c)
		}
	}
	r := newRigModel(t, sim, w, []scheduler.Option{scheduler.WithPreemption(true)}, append(opts, batcher.WithPipeline(pipe))...)
	ctx, stop := context.WithTimeout(context.Background(), 30*time.Second) // a stream still open then hangs
	defer stop()
	results := make([]result, len(cases))
	var wg sync.WaitGroup
	// queue queues c, cancelling it as it says. The loop calls it for a
	// request queued behind a step, while c's reader holds wg.
	w.queue = func(c *cancelCase) {
		s := c.seq
		if c.mode == cancelBeforeQueue {
			s.Cancel(errCancelled)
		}
		if err := r.queue.Push(&batcher.Entry{Value: s, Tier: s.Tier, Cost: len(s.Prompt) + s.MaxTokens}); err != nil {
			t.Errorf("queueing: %v", err)
			s.Fail(err)
			return
		}
		switch c.mode {
		case cancelQueued:
			s.Cancel(errCancelled)
		case cancelAfterDelay:
			wg.Go(func() {
				select {
				case <-time.After(c.delay):
				case <-ctx.Done():
				}
				s.Cancel(errCancelled)
			})
		}
	}
	for i, c := range cases {
		time.Sleep(c.gap)
		wg.Go(func() { results[i] = readCancelling(ctx, c) })
		if c.behindStep {
			w.arm(c)
		} else {
			w.queue(c)
		}
	}
	for _, c := range w.take() { // no step came behind them
		w.queue(c)
	}
	wg.Wait()

	for i, c := range cases {
		got, s := results[i], c.seq
		name := fmt.Sprintf("request %d (%s, prompt %d, max %d, adapter %q)", i, c.mode, len(s.Prompt), s.MaxTokens, s.Adapter)
		if errors.Is(got.err, context.DeadlineExceeded) {
			t.Fatalf("%s: the stream did not end (%d tokens)", name, len(got.tokens))
		}
		cancelled := c.mode != notCancelled
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
		case c.mode == cancelAfterTokens && len(got.tokens) < c.tokens:
			t.Errorf("%s: cancelled after %d tokens, got %d", name, c.tokens, len(got.tokens))
		}
	}
	preempted := 0
	for _, got := range results {
		if got.usage != nil {
			preempted += got.usage.Preemptions
		}
	}
	waitIdle(t, r, m)
	eligible, fired := w.fired()
	if fired == 0 && eligible > 0 {
		t.Errorf("none of the %d requests to cancel at their last prompt chunk was", eligible)
	}
	st := r.b.Stats()
	t.Logf("%d requests (%d cancelled at their last chunk), %d steps (%d sent ahead, %d drains), %d block preemptions, %d preemptions of streams that finished",
		len(cases), fired, st.Steps, st.Pipelined, st.Drains, st.BlockPreemptions, preempted)
}

// readCancelling reads c's stream to its end as collect does, cancelling
// the sequence once it received c.tokens tokens when c says so. It gives
// up when ctx ends (the result's err is then ctx's).
func readCancelling(ctx context.Context, c *cancelCase) result {
	return collectWith(ctx, c.seq, func(n int) {
		if c.mode == cancelAfterTokens && n == c.tokens {
			c.seq.Cancel(errCancelled)
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

// lastChunkModel wraps a simulated model and acts when a step carrying a
// prompt's last chunk (its sequence's first sampling row) is sent: it
// cancels the sequences of its cancelAtLastChunk cases then, or when that
// step is waited for — by the loop delivering it behind the next step, or
// by an admission whose open must wait for it — which is before the
// step's tokens are delivered; and it queues the requests armed to arrive
// behind such a step. It cancels the sequences of its cancelAtOpen cases
// when the engine is asked to open them (asynchronously or not). It knows
// a case's sequence by the prompt it is opened with.
type lastChunkModel struct {
	pagedModel
	cancelAt []*cancelCase
	queue    func(*cancelCase)

	mu      sync.Mutex
	ids     map[engine.SeqID]*cancelCase // of cancelAtLastChunk, opened, its last chunk not sent yet
	sampled map[engine.SeqID]bool        // sequences whose last chunk was sent
	armed   []*cancelCase                // to queue behind the next such step
}

func (w *lastChunkModel) Open(ctx context.Context, id engine.SeqID, prompt []int32, key string) (int, error) {
	w.opening(id, prompt)
	return w.pagedModel.Open(ctx, id, prompt, key)
}

func (w *lastChunkModel) OpenAsync(ctx context.Context, id engine.SeqID, prompt []int32, key string) (engine.PendingOpen, bool) {
	w.opening(id, prompt)
	return w.pagedModel.(engine.Pipeliner).OpenAsync(ctx, id, prompt, key)
}

func (w *lastChunkModel) Step(ctx context.Context, in []engine.StepInput) ([]engine.StepOutput, error) {
	cancel, last := w.lastChunks(in)
	for _, c := range cancel {
		c.seq.Cancel(errCancelled)
	}
	if last {
		for _, c := range w.take() {
			w.queue(c)
		}
	}
	return w.pagedModel.Step(ctx, in)
}

func (w *lastChunkModel) StepAsync(ctx context.Context, in []engine.StepInput) (engine.PendingStep, bool, error) {
	p, ok, err := w.pagedModel.(engine.Pipeliner).StepAsync(ctx, in)
	if err != nil || !ok {
		return p, ok, err
	}
	cancel, last := w.lastChunks(in)
	var atWait []*cancelCase
	for _, c := range cancel {
		if c.atSend {
			c.seq.Cancel(errCancelled)
		} else {
			atWait = append(atWait, c)
		}
	}
	if last {
		for _, c := range w.take() {
			w.queue(c)
		}
	}
	if len(atWait) == 0 {
		return p, ok, nil
	}
	return &cancelFirst{PendingStep: p, cancel: func() {
		for _, c := range atWait {
			c.seq.Cancel(errCancelled)
		}
	}}, true, nil
}

// arm makes c arrive behind the next step carrying a prompt's last chunk.
func (w *lastChunkModel) arm(c *cancelCase) {
	w.mu.Lock()
	w.armed = append(w.armed, c)
	w.mu.Unlock()
}

// take returns the armed requests and forgets them: its caller queues
// them.
func (w *lastChunkModel) take() []*cancelCase {
	w.mu.Lock()
	defer w.mu.Unlock()
	armed := w.armed
	w.armed = nil
	return armed
}

// fired returns how many of the cancelAtLastChunk cases can run (they
// ask for no adapter) and how many of those were cancelled at their last
// chunk.
func (w *lastChunkModel) fired() (eligible, fired int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.cancelAt {
		if c.mode == cancelAtLastChunk && c.seq.Adapter == "" {
			eligible++
			if c.fired {
				fired++
			}
		}
	}
	return eligible, fired
}

// opening cancels the sequence of the cancelAtOpen case that sequence
// id is, or notes which cancelAtLastChunk case it is: the first opened
// with its prompt (a recompute's feed is longer).
func (w *lastChunkModel) opening(id engine.SeqID, prompt []int32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.cancelAt {
		if c.fired || !slices.Equal(prompt, c.seq.Prompt) {
			continue
		}
		if c.mode == cancelAtOpen {
			c.fired = true
			c.seq.Cancel(errCancelled)
		} else {
			w.ids[id] = c
		}
		return
	}
}

// lastChunks returns the cancelAtLastChunk cases whose last prompt chunk in
// carries, forgetting them, and whether in carries any sequence's last
// chunk.
func (w *lastChunkModel) lastChunks(in []engine.StepInput) (cancel []*cancelCase, any bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range in {
		if !in[i].Sample || in[i].Prev || w.sampled[in[i].Seq] {
			continue
		}
		w.sampled[in[i].Seq], any = true, true
		if c := w.ids[in[i].Seq]; c != nil {
			delete(w.ids, in[i].Seq)
			c.fired = true
			cancel = append(cancel, c)
		}
	}
	return cancel, any
}

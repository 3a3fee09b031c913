// Package batchertest drives a batcher.ContinuousBatcher with requests
// cancelled at every point of their lives, for tests of the batcher over
// any engine (the simulated one, real workers): the cases of a workload
// (Case), and a Canceller that an engine wrapper calls so that requests
// are cancelled when their open is asked for or when the step carrying
// their last prompt chunk is sent or waited for, and so that chosen
// requests arrive right behind such a step.
package batchertest

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
)

// Mode is when a request is cancelled.
type Mode int

const (
	Kept        Mode = iota // not cancelled
	BeforeQueue             // before it is queued: never admitted
	Queued                  // right after it is queued, most often still waiting
	AfterDelay              // a random short time after it is queued, anywhere in its life
	AfterTokens             // by its reader, once it received some tokens
	AtLastChunk             // when the step with its last prompt chunk is sent or waited for
	AtOpen                  // when the engine is asked to open it
	Modes                   // the number of modes
)

func (m Mode) String() string {
	return [...]string{"not cancelled", "before queued", "while queued", "after a delay", "after tokens", "at its last chunk", "at its open"}[m]
}

// Case is one request of a workload: when it arrives and when it is
// cancelled.
type Case struct {
	Seq    *batcher.Sequence
	Mode   Mode
	Gap    time.Duration // wait before it arrives, after the request before it
	Delay  time.Duration // AfterDelay: from its queueing to its cancellation
	Tokens int           // AfterTokens: tokens its reader receives first
	AtSend bool          // AtLastChunk: when the step is sent rather than waited for
	// BehindStep: on arrival it waits to be queued until a step carrying
	// some prompt's last chunk is sent, so that an admission that cannot
	// open it asynchronously must wait for that step.
	BehindStep bool
	fired      bool // AtLastChunk, AtOpen: the Canceller cancelled it (under its lock)
}

// AllowAll is a batcher.Constraint that allows every token: a constrained
// sequence's open is never sent asynchronously and it makes every step it
// runs in synchronous, while its tokens stay those it gets alone.
type AllowAll struct{}

func (AllowAll) FillMask(mask []uint64) {
	for i := range mask {
		mask[i] = ^uint64(0)
	}
}
func (AllowAll) Accept(int32) error { return nil }
func (AllowAll) Done() bool         { return false }

// Canceller cancels the sequences of its AtLastChunk cases when the step
// carrying their last prompt chunk (their sequence's first sampling row)
// is sent, or when it is waited for — by the loop delivering it behind
// the next step, or by an admission whose open must wait for it — and
// those of its AtOpen cases when the engine is asked to open them; it
// queues the requests armed to arrive behind such a step. It knows a
// case's sequence by the prompt it is opened with (a recompute's feed is
// longer). An engine wrapper calls Opening before each open and Sent
// after each step it sent.
type Canceller struct {
	err      error                  // what it cancels with
	queue    func(c *Case)          // Drive's
	cancelAt []*Case                // the AtLastChunk and AtOpen cases
	mu       sync.Mutex             // guards what follows and the cases' fired
	ids      map[engine.SeqID]*Case // of AtLastChunk, opened, its last chunk not sent yet
	sampled  map[engine.SeqID]bool  // sequences whose last chunk was sent
	armed    []*Case                // to queue behind the next such step
}

// NewCanceller returns the Canceller of cases, cancelling with err.
func NewCanceller(cases []*Case, err error) *Canceller {
	w := &Canceller{err: err, ids: map[engine.SeqID]*Case{}, sampled: map[engine.SeqID]bool{}}
	for _, c := range cases {
		if c.Mode == AtLastChunk || c.Mode == AtOpen {
			w.cancelAt = append(w.cancelAt, c)
		}
	}
	return w
}

// Opening cancels the sequence of the AtOpen case that sequence id is,
// or notes which AtLastChunk case it is: the first opened with its
// prompt.
func (w *Canceller) Opening(id engine.SeqID, prompt []int32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.cancelAt {
		if c.fired || !slices.Equal(prompt, c.Seq.Prompt) {
			continue
		}
		if c.Mode == AtOpen {
			c.fired = true
			c.Seq.Cancel(w.err)
		} else {
			w.ids[id] = c
		}
		return
	}
}

// Sent is called as the step of inputs in is sent (before a Step, after
// a StepAsync that took it): it cancels the
// cases whose last prompt chunk the step carries (those that say AtSend,
// or every one when the step is not pending, async false) and queues the
// armed requests when it carries any sequence's last chunk. It returns
// the cases to cancel when the pending step is waited for.
func (w *Canceller) Sent(in []engine.StepInput, async bool) (atWait []*Case) {
	cancel, last := w.lastChunks(in)
	for _, c := range cancel {
		if async && !c.AtSend {
			atWait = append(atWait, c)
		} else {
			c.Seq.Cancel(w.err)
		}
	}
	if last {
		for _, c := range w.take() {
			w.queue(c)
		}
	}
	return atWait
}

// Cancel cancels cs's sequences (Sent's atWait, when their step is waited
// for).
func (w *Canceller) Cancel(cs []*Case) {
	for _, c := range cs {
		c.Seq.Cancel(w.err)
	}
}

// lastChunks returns the AtLastChunk cases whose last prompt chunk in
// carries, forgetting them, and whether in carries any sequence's last
// chunk.
func (w *Canceller) lastChunks(in []engine.StepInput) (cancel []*Case, any bool) {
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

// arm makes c arrive behind the next step carrying a prompt's last chunk.
func (w *Canceller) arm(c *Case) {
	w.mu.Lock()
	w.armed = append(w.armed, c)
	w.mu.Unlock()
}

// take returns the armed requests and forgets them: its caller queues
// them.
func (w *Canceller) take() []*Case {
	w.mu.Lock()
	defer w.mu.Unlock()
	armed := w.armed
	w.armed = nil
	return armed
}

// Fired returns, per mode, how many of the AtLastChunk and AtOpen cases
// can run (runs says which) and how many of those were cancelled so.
func (w *Canceller) Fired(runs func(*Case) bool) (eligible, fired [Modes]int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.cancelAt {
		if runs(c) {
			eligible[c.Mode]++
			if c.fired {
				fired[c.Mode]++
			}
		}
	}
	return eligible, fired
}

// Drive runs cases through a batcher whose engine calls w: each arrives
// after its gap with its stream read by read(i, c) on a goroutine of its
// own, and is queued by push (or armed behind the next step carrying a
// last chunk), cancelled as its mode says. push reports an error it
// failed the sequence with (then reported to t via fail). Drive returns
// once every reader returned; ctx bounds the AfterDelay timers.
func (w *Canceller) Drive(ctx context.Context, cases []*Case, push func(*batcher.Sequence) error, read func(i int, c *Case), fail func(error)) {
	var wg sync.WaitGroup
	// queue queues c, cancelling it as it says. The loop calls it for a
	// request queued behind a step, while c's reader holds wg.
	w.queue = func(c *Case) {
		s := c.Seq
		if c.Mode == BeforeQueue {
			s.Cancel(w.err)
		}
		if err := push(s); err != nil {
			fail(err)
			s.Fail(err)
			return
		}
		switch c.Mode {
		case Queued:
			s.Cancel(w.err)
		case AfterDelay:
			wg.Go(func() {
				select {
				case <-time.After(c.Delay):
				case <-ctx.Done():
				}
				s.Cancel(w.err)
			})
		}
	}
	for i, c := range cases {
		time.Sleep(c.Gap)
		wg.Go(func() { read(i, c) })
		if c.BehindStep {
			w.arm(c)
		} else {
			w.queue(c)
		}
	}
	for _, c := range w.take() { // no step came behind them
		w.queue(c)
	}
	wg.Wait()
}

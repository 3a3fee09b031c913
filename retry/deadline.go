package retry

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlxserving/mlxserving/api"
)

// ErrDeadline is wrapped by every *DeadlineError.
var ErrDeadline = errors.New("request deadline exceeded")

// DeadlineKind names one of a request's deadlines.
type DeadlineKind int

// The deadlines a Watch enforces.
const (
	// FirstToken bounds the time from submission to the first token:
	// queueing and prefill.
	FirstToken DeadlineKind = iota + 1
	// Stall bounds the longest gap between two tokens.
	Stall
	// Total bounds the time from submission to the end.
	Total
)

// String returns "time_to_first_token", "stall" or "total".
func (k DeadlineKind) String() string {
	switch k {
	case FirstToken:
		return "time_to_first_token"
	case Stall:
		return "stall"
	case Total:
		return "total"
	}
	return fmt.Sprintf("DeadlineKind(%d)", int(k))
}

// DeadlineError ends a request whose deadline fired. It wraps ErrDeadline
// and is not retryable.
type DeadlineError struct {
	// Kind is the deadline that fired.
	Kind DeadlineKind
	// Limit is its configured bound.
	Limit time.Duration
	// Tokens is the number of tokens produced before it fired.
	Tokens int
}

func (e *DeadlineError) Error() string {
	switch e.Kind {
	case FirstToken:
		return fmt.Sprintf("deadline exceeded: no first token within %v", e.Limit)
	case Stall:
		return fmt.Sprintf("deadline exceeded: no token for %v after %d tokens (stall)", e.Limit, e.Tokens)
	default:
		return fmt.Sprintf("deadline exceeded: request not finished within %v (%d tokens)", e.Limit, e.Tokens)
	}
}

// Unwrap returns ErrDeadline.
func (e *DeadlineError) Unwrap() error { return ErrDeadline }

// Retryable reports false.
func (e *DeadlineError) Retryable() bool { return false }

// Deadlines bound one request; the type lives in api so a request
// carries it without importing retry. A zero field turns that deadline
// off; the zero value enforces none.
type Deadlines = api.Deadlines

// Watch enforces Deadlines on one request. The producer of its tokens
// calls Token for each one; when a deadline passes, Watch calls the expire
// function once with the *DeadlineError. It starts no goroutine of its
// own: its timers run expire on the runtime's timer goroutine, so expire
// must not block (cancel a context, mark a sequence). Stop ends it.
type Watch struct {
	d      Deadlines
	expire func(*DeadlineError)

	tokens atomic.Int64
	last   atomic.Int64 // unix nanos of the last token

	mu      sync.Mutex
	stopped bool
	first   *time.Timer
	stall   *time.Timer
	total   *time.Timer
}

// NewWatch starts enforcing d for a request submitted at start. expire is
// called at most once. With zero Deadlines the Watch does nothing.
func NewWatch(d Deadlines, start time.Time, expire func(*DeadlineError)) *Watch {
	w := &Watch{d: d, expire: expire}
	w.last.Store(start.UnixNano())
	w.mu.Lock()
	defer w.mu.Unlock()
	if d.FirstToken > 0 {
		w.first = time.AfterFunc(time.Until(start.Add(d.FirstToken)), func() {
			if w.tokens.Load() == 0 {
				w.fire(FirstToken, d.FirstToken)
			}
		})
	}
	if d.Total > 0 {
		w.total = time.AfterFunc(time.Until(start.Add(d.Total)), func() { w.fire(Total, d.Total) })
	}
	return w
}

// Token records a token produced now. Safe for concurrent use; cheap (two
// atomic stores; a timer is started on the first token only).
func (w *Watch) Token() {
	if w == nil {
		return
	}
	now := time.Now().UnixNano()
	w.last.Store(now)
	if w.tokens.Add(1) != 1 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	if w.first != nil {
		w.first.Stop()
	}
	if w.d.Stall > 0 {
		w.stall = time.AfterFunc(w.d.Stall, w.checkStall)
	}
}

// checkStall fires the stall deadline if no token came for Stall, and
// otherwise waits for the rest of the gap.
func (w *Watch) checkStall() {
	gap := time.Since(time.Unix(0, w.last.Load()))
	if gap >= w.d.Stall {
		w.fire(Stall, w.d.Stall)
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.stall.Reset(w.d.Stall - gap)
	}
}

func (w *Watch) fire(kind DeadlineKind, limit time.Duration) {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.stopTimersLocked()
	w.mu.Unlock()
	w.expire(&DeadlineError{Kind: kind, Limit: limit, Tokens: int(w.tokens.Load())})
}

// Stop ends the watch; no deadline fires after it returns (one already
// firing may still be running its expire). Idempotent; nil-safe.
func (w *Watch) Stop() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopTimersLocked()
}

// stopTimersLocked stops every timer. Has to be called with w.mu held.
func (w *Watch) stopTimersLocked() {
	w.stopped = true
	for _, t := range []*time.Timer{w.first, w.stall, w.total} {
		if t != nil {
			t.Stop()
		}
	}
}

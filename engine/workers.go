package engine

import "fmt"

// WorkerBreakers is implemented by engines that run their models on
// several workers (processes), each behind a circuit breaker that stops
// sending work to a worker that keeps failing. The serving layer reports
// the breakers in its statistics and metrics.
//
// Breakers is safe for concurrent use.
type WorkerBreakers interface {
	// Breakers returns a snapshot of every worker's breaker, in worker
	// order, each named after its worker ("worker-0", ...).
	Breakers() []BreakerStatus
}

// WorkerLocator is implemented by models whose saved KV lives on one of
// several workers, so that a caller can send a later request that reuses
// it to the same worker (package session records it per session).
//
// SavedWorker is serialised with Open, Step and Free like them.
type WorkerLocator interface {
	// SavedWorker returns the index of the worker holding the KV saved
	// under key, or -1 when no live worker holds it.
	SavedWorker(key string) int
}

// BreakerState is a circuit breaker's state. Package retry's breakers
// report theirs in it (retry.State is this type).
type BreakerState int

// Breaker states.
const (
	// BreakerClosed lets every request through and counts failures.
	BreakerClosed BreakerState = iota
	// BreakerHalfOpen lets a few probe requests through; their successes
	// close the breaker, a failure opens it again.
	BreakerHalfOpen
	// BreakerOpen refuses requests until the open timeout passes.
	BreakerOpen
)

// String returns "closed", "half-open" or "open".
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerHalfOpen:
		return "half-open"
	case BreakerOpen:
		return "open"
	}
	return fmt.Sprintf("BreakerState(%d)", int(s))
}

// BreakerStatus is a snapshot of a circuit breaker, for statistics and
// metrics (retry.Status is this type).
type BreakerStatus struct {
	// Name is the breaker's name: the worker or backend it guards.
	Name  string
	State BreakerState
	// Requests, Failures and ConsecutiveFailures are the counts of the
	// current window (closed) or probe round (half-open).
	Requests            uint32
	Failures            uint32
	ConsecutiveFailures uint32
}

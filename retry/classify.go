package retry

import (
	"errors"
	"fmt"
	"time"
)

// Marker is implemented by errors that decide for themselves whether they
// are retryable. Classify asks the outermost Marker in an error's chain
// before anything else, so a wrapper can overrule what it wraps.
type Marker interface {
	Retryable() bool
}

// Retryable reports whether err is worth another attempt, from the start,
// on the same or another worker or backend: Classify(err).Retryable().
//
// Retryable: engine.ErrWorkerLost, ErrBreakerOpen (another backend may
// take it), a refused or reset connection (ECONNREFUSED, ECONNRESET:
// wrap them in an InterruptedError once a byte of the answer arrived) and
// a refusal for load or unavailability (a full queue, a client over its
// rate, a 429 or 503) that carries a Retry-After.
//
// Not retryable: nil, a caller's cancellation or deadline, a
// *DeadlineError, an *InterruptedError (a token reached the caller),
// invalid parameters, an exceeded context length, a bad checkpoint, an
// unknown model, and anything else not listed above.
func Retryable(err error) bool { return Classify(err).Retryable() }

// RetryAfterHinter is the one way an error says how long to wait before
// trying again: the scheduler's queue-full, rate-limit and no-backend
// errors, the model manager's load and budget errors, and the transports'
// errors implement it, and the balancer, the retry policy, the HTTP
// Retry-After header and the NATS wire read it through RetryAfter.
type RetryAfterHinter interface {
	RetryAfterHint() time.Duration
}

// RetryAfter returns the wait err asks for, if it carries one: the first
// error in the chain that implements RetryAfterHinter with a positive
// value.
func RetryAfter(err error) (time.Duration, bool) {
	var h RetryAfterHinter
	if errors.As(err, &h) {
		if d := h.RetryAfterHint(); d > 0 {
			return d, true
		}
	}
	return 0, false
}

// StatusError is a refusal from a remote backend: its HTTP status (a
// number, so that classifying one needs no HTTP package) and the
// Retry-After it sent, if any.
type StatusError struct {
	// Code is the HTTP status.
	Code int
	// RetryAfter is the backend's Retry-After; 0 when it sent none.
	RetryAfter time.Duration
	// Message is the backend's error message, if it gave one.
	Message string
}

func (e *StatusError) Error() string {
	msg := fmt.Sprintf("backend answered status %d", e.Code)
	if e.Message != "" {
		msg += ": " + e.Message
	}
	if e.RetryAfter > 0 {
		msg += fmt.Sprintf(" (retry after %v)", e.RetryAfter)
	}
	return msg
}

// RetryAfterHint returns RetryAfter.
func (e *StatusError) RetryAfterHint() time.Duration { return e.RetryAfter }

// InterruptedError is a failure after tokens reached the caller. It is
// never retried: a second attempt would repeat or contradict what the
// caller already has.
type InterruptedError struct {
	// Delivered is the number of tokens the caller had received.
	Delivered int
	// Err is the failure.
	Err error
}

func (e *InterruptedError) Error() string {
	return fmt.Sprintf("stream interrupted after %d tokens: %v", e.Delivered, e.Err)
}

// Unwrap returns the failure.
func (e *InterruptedError) Unwrap() error { return e.Err }

// Retryable reports false.
func (e *InterruptedError) Retryable() bool { return false }

// Permanent marks err as not retryable whatever it wraps. It returns nil
// for nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string   { return e.err.Error() }
func (e *permanentError) Unwrap() error   { return e.err }
func (e *permanentError) Retryable() bool { return false }

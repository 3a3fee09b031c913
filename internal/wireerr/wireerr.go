// Package wireerr carries an error across a transport. The sender names
// the error by its classification's code (retry.Classify: the codes are
// retry's Code constants) and the details its typed error holds; the
// receiver rebuilds the typed error from them, so that errors.Is/As and
// retry.Classify find on the far side of the wire what they found on the
// near one. It is the one place that knows which typed error each code
// stands for: the transports (balancer/httpbackend, balancer/natsbackend)
// share it.
//
// It lives apart from retry, where the codes are, because two of the
// typed errors it rebuilds are the scheduler's, and the scheduler imports
// retry.
//
//	f := wireerr.Of(err)  // the sender: code, message, param, numbers
//	// ... f crosses the wire in the transport's own format ...
//	typed := f.Err()      // the receiver: *scheduler.QueueFullError, ...
package wireerr

import (
	"errors"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
)

// Fields are what a transport carries of an error.
type Fields struct {
	// Code is the classification's code (retry.Classify(err).Code).
	Code string
	// Message is the error's message.
	Message string
	// Param is the request parameter at fault, for an
	// *engine.InvalidParamError; "" otherwise.
	Param string
	// RetryAfter is the wait the error asks for; 0 when none.
	RetryAfter time.Duration
	// Context is a context-length refusal's numbers, so the receiver can
	// fit a request as the sender would; nil otherwise.
	Context *engine.ContextLengthError
	// Deadline is the request deadline that fired, with its limit; nil
	// otherwise.
	Deadline *retry.DeadlineError
}

// Of returns what a transport sends of err: its class's code and
// Retry-After, its message, and the details of the typed errors the
// receiver rebuilds.
func Of(err error) Fields {
	c := retry.Classify(err)
	f := Fields{Code: c.Code, Message: err.Error(), RetryAfter: c.RetryAfter}
	var (
		ip *engine.InvalidParamError
		cl *engine.ContextLengthError
		de *retry.DeadlineError
	)
	if c.Code == retry.CodeInvalidValue && errors.As(err, &ip) {
		f.Param = ip.Param
	}
	if c.Kind == retry.ContextLength && errors.As(err, &cl) {
		f.Context = cl
	}
	if c.Kind == retry.Deadline && errors.As(err, &de) {
		f.Deadline = de
	}
	return f
}

// Err returns the typed error f's code stands for, carrying f's details,
// so that it classifies on the receiving side with f's code: an
// *engine.InvalidParamError, an *engine.ContextLengthError (or
// engine.ErrContextLength without numbers), a *scheduler.QueueFullError, a
// *scheduler.RateLimitError, a *retry.DeadlineError, the engine's
// sentinel for an unknown model, a lost worker, an unavailable server or
// an exhausted memory, and for the other codes of retry an error that
// names its code (retry.NewError). It returns nil for retry.CodeInternal,
// for "" and for a code retry does not know (a foreign server's): the
// transport's own error decides the class then (a remote HTTP status, a
// lost connection).
func (f Fields) Err() error {
	switch f.Code {
	case "", retry.CodeInternal:
		return nil
	case retry.CodeInvalidValue:
		return &engine.InvalidParamError{Param: f.Param, Reason: f.Message}
	case retry.CodeContextLength:
		if f.Context != nil {
			return f.Context
		}
		return engine.ErrContextLength
	case retry.CodeQueueFull:
		return &scheduler.QueueFullError{RetryAfter: f.RetryAfter}
	case retry.CodeRateLimited:
		return &scheduler.RateLimitError{RetryAfter: f.RetryAfter}
	case retry.CodeModelNotFound:
		return engine.ErrModelNotFound
	case retry.CodeWorkerLost:
		return engine.ErrWorkerLost // the remote lost the work: its breaker counts it
	case retry.CodeUnavailable:
		return engine.ErrUnavailable
	case retry.CodeOutOfMemory:
		return engine.ErrOutOfMemory
	}
	if kind, ok := deadlineKinds[f.Code]; ok {
		if f.Deadline != nil && f.Deadline.Kind == kind {
			return f.Deadline
		}
		return &retry.DeadlineError{Kind: kind}
	}
	if retry.KindOf(f.Code) == retry.Internal {
		return nil // not one of retry's codes
	}
	return retry.NewError(f.Code, f.Message)
}

// deadlineKinds are the request deadlines by their codes.
var deadlineKinds = map[string]retry.DeadlineKind{
	retry.CodeFirstTokenDeadline: retry.FirstToken,
	retry.CodeStallDeadline:      retry.Stall,
	retry.CodeTotalDeadline:      retry.Total,
}

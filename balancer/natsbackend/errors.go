package natsbackend

import (
	"errors"
	"fmt"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/wireerr"
	"github.com/mlxserving/mlxserving/retry"
)

var (
	// ErrInstanceLost means an instance stopped answering: no reply to a
	// request, or no chunk or heartbeat within the heartbeat timeout.
	ErrInstanceLost = errors.New("natsbackend: instance stopped answering")
	// ErrClosed is returned by requests on a stopped Service or a closed
	// Discovery's backends.
	ErrClosed = fmt.Errorf("natsbackend: %w", engine.ErrClosed)
	// ErrNotConnected means the NATS connection is down (reconnecting or
	// closed).
	ErrNotConnected = errors.New("natsbackend: NATS not connected")
	// ErrProtocol means a message was not what the protocol allows.
	ErrProtocol = errors.New("natsbackend: bad message")
	// ErrNameTaken is returned by Serve when a live instance of the
	// service already answers under the name.
	ErrNameTaken = errors.New("natsbackend: instance name taken")
)

// Error is a failure reported by, or on the way to, an instance, before
// any text reached the caller (after, it is wrapped in a
// *retry.InterruptedError). It unwraps to the typed error its code stands
// for (an *engine.InvalidParamError, an *engine.ContextLengthError, a
// *scheduler.QueueFullError, a *scheduler.RateLimitError, a
// *retry.DeadlineError, engine.ErrModelNotFound, ...), so callers classify
// it as they would a local error, and to Err, the transport failure, when
// there is one.
type Error struct {
	// Instance is the instance's name.
	Instance string
	// Code is the instance's classification of the error
	// (retry.Classify): one of retry's Code constants
	// ("model_not_found", "invalid_value", "context_length_exceeded",
	// "queue_full", "rate_limit_exceeded", "engine_error", ...); "" for a
	// transport failure.
	Code string
	// Message is the instance's error message.
	Message string
	// Param is the parameter at fault for "invalid_value".
	Param string
	// RetryAfter is the instance's suggested wait; 0 when none.
	RetryAfter time.Duration
	// ContextLength is the instance's context-length refusal, with its
	// numbers, for code "context_length_exceeded"; nil otherwise.
	ContextLength *engine.ContextLengthError
	// Deadline is the request deadline that fired, for the deadline
	// codes ("time_to_first_token_exceeded", ...).
	Deadline *retry.DeadlineError
	// Err is the transport failure (no responders, NATS unreachable,
	// ErrInstanceLost), when there is one.
	Err error

	retryable bool
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("natsbackend: instance %q: ", e.Instance)
	switch {
	case e.Err != nil:
		msg += e.Err.Error()
	default:
		msg += e.Message
	}
	if e.RetryAfter > 0 {
		msg += fmt.Sprintf(" (retry after %v)", e.RetryAfter)
	}
	return msg
}

// Retryable reports whether the request may go to another instance:
// transport failures and busy or failing instances are, bad requests are
// not.
func (e *Error) Retryable() bool { return e.retryable }

// RetryAfterHint returns RetryAfter.
func (e *Error) RetryAfterHint() time.Duration { return e.RetryAfter }

// Unwrap returns Err and the typed error for Code.
func (e *Error) Unwrap() []error {
	var errs []error
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	f := wireerr.Fields{Code: e.Code, Message: e.Message, Param: e.Param, RetryAfter: e.RetryAfter,
		Context: e.ContextLength, Deadline: e.Deadline}
	if typed := f.Err(); typed != nil {
		errs = append(errs, typed)
	}
	return errs
}

func transportError(instance string, err error) *Error {
	return &Error{Instance: instance, Err: err, retryable: true}
}

func fromWire(instance string, w wireError) *Error {
	return &Error{Instance: instance, Code: w.code(), Message: w.Message, Param: w.Param, RetryAfter: w.RetryAfter,
		ContextLength: w.Context, Deadline: w.Deadline, retryable: w.Retryable}
}

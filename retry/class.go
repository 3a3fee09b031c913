package retry

import (
	"context"
	"fmt"
	"reflect"
	"syscall"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
)

// Kind is the broad class of an error: who is at fault and what the
// caller can do about it.
type Kind uint8

// Kinds. The zero Kind is OK: no error.
const (
	// OK is no error.
	OK Kind = iota
	// Invalid is a request that is wrong as sent (a bad parameter, a
	// body too large): sending it again changes nothing.
	Invalid
	// NotFound is a request for a model the server does not serve.
	NotFound
	// ContextLength is a request longer than the model's context.
	ContextLength
	// Overloaded is a refusal for load: a full queue, a client over its
	// rate, a memory budget, no backend free. Later may work.
	Overloaded
	// Unavailable is a server, worker or backend that cannot serve now:
	// closed, its worker lost, its breaker open, its model failing to
	// load.
	Unavailable
	// Deadline is a request deadline that fired.
	Deadline
	// Canceled is the caller's cancellation.
	Canceled
	// Interrupted is a failure after tokens reached the caller.
	Interrupted
	// Internal is anything else: a bug or an unknown failure.
	Internal
)

var kindNames = [...]string{"ok", "invalid", "not_found", "context_length", "overloaded",
	"unavailable", "deadline", "canceled", "interrupted", "internal"}

// String returns the kind's name in snake case ("not_found").
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Error codes: the "code" of an OpenAI-shaped error body. A package whose
// errors Classify cannot import names its code with [NewError] or an
// ErrorCode method (see [Coder]).
const (
	CodeInvalidValue       = "invalid_value"
	CodeRequestTooLarge    = "request_too_large"
	CodeUnsupportedModel   = "unsupported_model"
	CodeTemplate           = "template_error"
	CodeExceedsKVCapacity  = "exceeds_kv_capacity"
	CodeModelNotFound      = "model_not_found"
	CodeContextLength      = "context_length_exceeded"
	CodeQueueFull          = "queue_full"
	CodeRateLimited        = "rate_limit_exceeded"
	CodeBudgetExhausted    = "memory_budget_exhausted"
	CodeNoBackend          = "no_backend_available"
	CodeOutOfMemory        = "out_of_memory"
	CodeUnavailable        = "unavailable"
	CodeWorkerLost         = "worker_unavailable"
	CodeLoadFailed         = "model_load_failed"
	CodeFirstTokenDeadline = "time_to_first_token_exceeded"
	CodeStallDeadline      = "stall_timeout"
	CodeTotalDeadline      = "request_timeout"
	CodeTimeout            = "timeout"
	CodeCanceled           = "canceled"
	CodeInterrupted        = "stream_interrupted"
	CodeInternal           = "engine_error"
)

// codeKinds gives the kind of every code; a code not listed is Internal.
var codeKinds = map[string]Kind{
	CodeInvalidValue: Invalid, CodeRequestTooLarge: Invalid, CodeUnsupportedModel: Invalid, CodeTemplate: Invalid,
	CodeExceedsKVCapacity: Invalid, CodeModelNotFound: NotFound, CodeContextLength: ContextLength,
	CodeQueueFull: Overloaded, CodeRateLimited: Overloaded, CodeBudgetExhausted: Overloaded,
	CodeNoBackend: Overloaded, CodeOutOfMemory: Overloaded,
	CodeUnavailable: Unavailable, CodeWorkerLost: Unavailable, CodeLoadFailed: Unavailable,
	CodeFirstTokenDeadline: Deadline, CodeStallDeadline: Deadline, CodeTotalDeadline: Deadline,
	CodeTimeout: Deadline, CodeCanceled: Canceled, CodeInterrupted: Interrupted, CodeInternal: Internal,
}

// KindOf returns the kind of an error code; Internal for a code it does
// not know.
func KindOf(code string) Kind {
	if k, ok := codeKinds[code]; ok {
		return k
	}
	return Internal
}

// Coder is implemented by errors that name their own code, so that
// packages Classify cannot import (the scheduler, the model manager, the
// server) classify their errors here. The outermost Coder in a chain
// wins.
type Coder interface {
	ErrorCode() string
}

// NewError returns a sentinel error with message msg that classifies as
// code: errors.New for errors whose package Classify does not import.
func NewError(code, msg string) error { return &codedError{code: code, msg: msg} }

type codedError struct{ code, msg string }

func (e *codedError) Error() string     { return e.msg }
func (e *codedError) ErrorCode() string { return e.code }

// Class is what the serving stack makes of an error, decided once by
// [Classify]: whether to try again, whether it counts against a
// backend's breaker, whether a balancer sends the request elsewhere, the
// error code the API answers (the HTTP layer maps the class to a status:
// openai.Status) and the metrics outcome.
type Class struct {
	// Kind is the broad class.
	Kind Kind
	// Code is the error code the HTTP API and the transports send
	// ("queue_full"); "" for OK.
	Code string
	// RetryAfter is the wait the error asks for (see RetryAfter); 0 when
	// none.
	RetryAfter time.Duration

	lost    bool // the backend lost the work: a fault of the backend
	verdict int8 // a Marker's Retryable: 1 yes, -1 no, 0 none
}

// Retryable reports whether the request is worth another attempt from the
// start: a lost worker, a refused or reset connection, an open breaker
// (another backend may take it), and a refusal for load or unavailability
// that says when to come back (RetryAfter). A Marker in the chain (a
// Permanent error, an *ExhaustedError) decides instead.
func (c Class) Retryable() bool {
	if c.verdict != 0 {
		return c.verdict > 0
	}
	switch c.Kind {
	case Unavailable:
		return c.Code == CodeWorkerLost || c.RetryAfter > 0
	case Overloaded:
		return c.RetryAfter > 0
	}
	return false
}

// CountsAsFailure reports whether the outcome is the backend's failure,
// counted by its breaker: it lost the work (a lost worker, a refused or
// reset connection, a 5xx, a stall, such a failure after tokens, an
// unknown failure a transport marks retryable) or it is closed or cannot
// run. A busy backend, an open breaker, bad input and the caller's
// cancellation are not its failures.
func (c Class) CountsAsFailure() bool {
	switch {
	case c.lost, c.Code == CodeUnavailable:
		return true
	case c.Kind == Internal:
		return c.verdict > 0 // lost in transit (a dropped connection, a lost instance)
	}
	return false
}

// FailsOver reports whether a balancer, meeting the error before any token
// reached the caller, sends the request on to another backend: the
// backend could not take or keep it (down, closed, full, lost its worker,
// lacks the model or the KV room), as opposed to the request being wrong,
// the client over its rate, a request deadline fired or the caller gone.
func (c Class) FailsOver() bool {
	switch c.Kind {
	case NotFound, Unavailable, Internal:
		return true
	case Overloaded:
		return c.Code != CodeRateLimited
	case Invalid:
		return c.Code == CodeExceedsKVCapacity
	case Deadline:
		return c.Code == CodeTimeout // a backend's own timeout, not a request deadline
	}
	return false
}

// Request outcomes, the "outcome" attribute of the request metrics.
const (
	outcomeOK          = "ok"
	outcomeInvalid     = "invalid"
	outcomeNotFound    = "not_found"
	outcomeRejected    = "rejected"
	outcomeUnavailable = "unavailable"
	outcomeDeadline    = "deadline"
	outcomeCancelled   = "cancelled"
	outcomeError       = "error"
)

// Outcome returns the metrics outcome: "ok", "invalid" (Invalid and
// ContextLength), "not_found", "rejected" (Overloaded), "unavailable",
// "deadline", "cancelled" or "error" (Interrupted and Internal).
func (c Class) Outcome() string {
	switch c.Kind {
	case OK:
		return outcomeOK
	case Invalid, ContextLength:
		return outcomeInvalid
	case NotFound:
		return outcomeNotFound
	case Overloaded:
		return outcomeRejected
	case Unavailable:
		return outcomeUnavailable
	case Deadline:
		return outcomeDeadline
	case Canceled:
		return outcomeCancelled
	}
	return outcomeError
}

// String returns the kind and code ("overloaded/queue_full").
func (c Class) String() string {
	if c.Kind == OK {
		return "ok"
	}
	return c.Kind.String() + "/" + c.Code
}

// Classify returns err's class. The outermost error in the chain that
// names a class decides it: an *InterruptedError, a *DeadlineError, a
// Coder, an engine sentinel, the caller's cancellation or deadline, a
// refused or reset connection. A *StatusError (a
// remote backend's status) decides only when nothing else in the chain
// does, since transports unwrap to both. Anything else is Internal.
func Classify(err error) Class {
	if err == nil {
		return Class{Kind: OK}
	}
	var sc scan
	sc.walk(err)
	c := sc.class
	switch {
	case sc.hasClass:
	case sc.hasStatus:
		c = sc.status
	default:
		c = Class{Kind: Internal, Code: CodeInternal}
	}
	c.RetryAfter, c.verdict = sc.after, sc.verdict
	return c
}

// scan gathers in one walk of a chain what Classify reads: the first
// class, the first remote status, the first RetryAfterHinter's hint and
// the first Marker's verdict.
type scan struct {
	class, status       Class
	hasClass, hasStatus bool
	hinted              bool
	after               time.Duration
	verdict             int8
}

// walk visits err's chain depth first, as errors.As does, until it has
// found all four.
func (sc *scan) walk(err error) bool {
	for err != nil {
		if sc.visit(err) {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if sc.walk(e) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

// visit reads one link of a chain and reports whether the scan is done.
func (sc *scan) visit(err error) bool {
	if !sc.hasClass {
		sc.class, sc.hasClass = classifyOne(err)
	}
	if !sc.hasStatus {
		sc.status, sc.hasStatus = classifyStatus(err)
	}
	if h, ok := err.(RetryAfterHinter); ok && !sc.hinted {
		sc.hinted, sc.after = true, max(h.RetryAfterHint(), 0)
	}
	if m, ok := err.(Marker); ok && sc.verdict == 0 {
		sc.verdict = -1
		if m.Retryable() {
			sc.verdict = 1
		}
	}
	return sc.hasClass && sc.hasStatus && sc.hinted && sc.verdict != 0
}

// sentinels are the errors Classify knows by identity.
var sentinels = map[error]Class{
	engine.ErrInvalidParam:   {Kind: Invalid, Code: CodeInvalidValue},
	engine.ErrContextLength:  {Kind: ContextLength, Code: CodeContextLength},
	engine.ErrModelNotFound:  {Kind: NotFound, Code: CodeModelNotFound},
	engine.ErrOutOfMemory:    {Kind: Overloaded, Code: CodeOutOfMemory},
	engine.ErrWorkerLost:     {Kind: Unavailable, Code: CodeWorkerLost, lost: true},
	engine.ErrClosed:         {Kind: Unavailable, Code: CodeUnavailable},
	engine.ErrUnavailable:    {Kind: Unavailable, Code: CodeUnavailable},
	api.ErrUnknownTier:       {Kind: Invalid, Code: CodeInvalidValue},
	api.ErrAbandoned:         {Kind: Canceled, Code: CodeCanceled},      // the caller walked away
	ErrBreakerOpen:           {Kind: Unavailable, Code: CodeWorkerLost}, // refused, not lost: no fault
	context.Canceled:         {Kind: Canceled, Code: CodeCanceled},
	context.DeadlineExceeded: {Kind: Deadline, Code: CodeTimeout},
	syscall.ECONNREFUSED:     {Kind: Unavailable, Code: CodeWorkerLost, lost: true},
	syscall.ECONNRESET:       {Kind: Unavailable, Code: CodeWorkerLost, lost: true},
}

var deadlineCodes = map[DeadlineKind]string{
	FirstToken: CodeFirstTokenDeadline,
	Stall:      CodeStallDeadline,
	Total:      CodeTotalDeadline,
}

// classifyOne classifies one link of a chain, not what it wraps.
func classifyOne(err error) (Class, bool) {
	switch e := err.(type) {
	case *InterruptedError:
		inner := Classify(e.Err)
		return Class{Kind: Interrupted, Code: CodeInterrupted, lost: inner.CountsAsFailure()}, true
	case *DeadlineError:
		code, ok := deadlineCodes[e.Kind]
		if !ok {
			code = CodeTotalDeadline
		}
		return Class{Kind: Deadline, Code: code, lost: e.Kind == Stall}, true
	case *engine.InvalidParamError:
		if cause := Classify(e.Err); cause.Kind == Invalid { // a refusal that names its code
			return Class{Kind: Invalid, Code: cause.Code}, true
		}
		return Class{Kind: Invalid, Code: CodeInvalidValue}, true
	case Coder:
		code := e.ErrorCode()
		return Class{Kind: KindOf(code), Code: code}, true
	}
	if isComparable(err) {
		if c, ok := sentinels[err]; ok {
			return c, true
		}
	}
	return Class{}, false
}

// isComparable reports whether err can be a map key without a panic.
func isComparable(err error) bool { return reflect.TypeOf(err).Comparable() }

// classifyStatus classifies a remote backend's HTTP status.
func classifyStatus(err error) (Class, bool) {
	st, ok := err.(*StatusError)
	if !ok {
		return Class{}, false
	}
	switch code := st.Code; {
	case code == 404:
		return Class{Kind: NotFound, Code: CodeModelNotFound}, true
	case code == 413:
		return Class{Kind: Invalid, Code: CodeRequestTooLarge}, true
	case code == 408:
		return Class{Kind: Deadline, Code: CodeTimeout}, true
	case code == 429: // a full upstream: try another
		return Class{Kind: Overloaded, Code: CodeQueueFull}, true
	case code == 503:
		return Class{Kind: Unavailable, Code: CodeUnavailable}, true
	case code >= 500:
		return Class{Kind: Internal, Code: CodeInternal, lost: true}, true
	case code >= 400:
		return Class{Kind: Invalid, Code: CodeInvalidValue}, true
	}
	return Class{}, false
}

package scheduler

import (
	"errors"
	"fmt"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// Sentinel errors; the typed errors below unwrap to them, so callers
// branch with errors.Is and read the details with errors.As.
var (
	// ErrQueueFull means the queue is at its request or token bound. The
	// *QueueFullError says when to retry.
	ErrQueueFull = retry.NewError(retry.CodeQueueFull, "queue full")
	// ErrRateLimited means the client sent more than its rate allows. The
	// *RateLimitError says when to retry.
	ErrRateLimited = retry.NewError(retry.CodeRateLimited, "rate limited")
	// ErrInvalidEntry means an entry cannot be queued as given (Cost below
	// 1, nil, or already queued).
	ErrInvalidEntry = errors.New("invalid queue entry")
	// ErrInvalidOption means a constructor option has a value out of range.
	ErrInvalidOption = errors.New("invalid scheduler option")
	// ErrClosed means the scheduler was closed and takes no new work.
	ErrClosed = fmt.Errorf("scheduler: %w", engine.ErrClosed)
)

// QueueFullError reports a rejection by the queue's bounds.
type QueueFullError struct {
	// Tier is the refused entry's tier.
	Tier api.Tier
	// Queued and QueuedTokens are what the queue held when it refused.
	Queued, QueuedTokens int
	// MaxQueued and MaxQueuedTokens are the bounds as they apply to Tier
	// (0 = unbounded); see WithHeadroom.
	MaxQueued, MaxQueuedTokens int
	// Cost is the refused entry's cost.
	Cost int
	// RetryAfter estimates how long the queue takes to drain what it holds
	// at the observed drain rate; see [WithMaxQueued].
	RetryAfter time.Duration
}

func (e *QueueFullError) Error() string {
	if e.MaxQueued > 0 && e.Queued >= e.MaxQueued {
		return fmt.Sprintf("queue full: %d requests queued (limit %d for %s), retry after %s",
			e.Queued, e.MaxQueued, e.Tier, e.RetryAfter)
	}
	return fmt.Sprintf("queue full: %d tokens queued + %d requested exceeds the limit of %d tokens for %s, retry after %s",
		e.QueuedTokens, e.Cost, e.MaxQueuedTokens, e.Tier, e.RetryAfter)
}

// Unwrap returns ErrQueueFull.
func (e *QueueFullError) Unwrap() error { return ErrQueueFull }

// RetryAfterHint returns RetryAfter: the one retry-after protocol
// (retry.RetryAfter reads it, through every transport).
func (e *QueueFullError) RetryAfterHint() time.Duration { return e.RetryAfter }

// RateLimitError reports a client over its rate.
type RateLimitError struct {
	// Client is the rate-limit key that was refused.
	Client string
	// Rate and Burst are the limit: requests per second and bucket size.
	Rate  float64
	Burst int
	// RetryAfter is when the client's bucket holds a whole token again.
	RetryAfter time.Duration
}

func (e *RateLimitError) Error() string {
	return fmt.Sprintf("rate limited: client %q is over %g requests/s (burst %d), retry after %s",
		e.Client, e.Rate, e.Burst, e.RetryAfter)
}

// Unwrap returns ErrRateLimited.
func (e *RateLimitError) Unwrap() error { return ErrRateLimited }

// RetryAfterHint returns RetryAfter (see retry.RetryAfter).
func (e *RateLimitError) RetryAfterHint() time.Duration { return e.RetryAfter }

// CapacityError reports a request larger than a model's whole KV cache:
// it could never run, however long it waited.
type CapacityError struct {
	// Model is the model id.
	Model string
	// Prompt and MaxNew are the request's prompt tokens and tokens to
	// generate; Capacity is the KV cache size in tokens.
	Prompt, MaxNew, Capacity int
}

func (e *CapacityError) Error() string {
	return fmt.Sprintf("out of memory: model %q holds %d tokens of KV cache in all; the request needs %d (%d prompt + %d to generate)",
		e.Model, e.Capacity, e.Prompt+e.MaxNew, e.Prompt, e.MaxNew)
}

// Unwrap returns engine.ErrOutOfMemory.
func (e *CapacityError) Unwrap() error { return engine.ErrOutOfMemory }

// ErrorCode returns retry.CodeExceedsKVCapacity (see retry.Classify): a
// request no wait helps, though a backend with more KV room may take it.
func (e *CapacityError) ErrorCode() string { return retry.CodeExceedsKVCapacity }

// CheckFits rejects, before queueing, a request that can never run: it
// returns *engine.InvalidParamError for an empty prompt or maxNew below 1,
// *engine.ContextLengthError when prompt+maxNew exceeds contextLength, and
// *CapacityError (wrapping engine.ErrOutOfMemory) when prompt+maxNew
// exceeds the model's whole KV capacity. A contextLength or kvCapacity of
// 0 or less is unknown and not checked.
func CheckFits(model string, prompt, maxNew, contextLength, kvCapacity int) error {
	if prompt < 1 {
		return &engine.InvalidParamError{Param: "prompt", Reason: fmt.Sprintf("%d tokens: must not be empty", prompt)}
	}
	if maxNew < 1 {
		return &engine.InvalidParamError{Param: "max_tokens", Reason: fmt.Sprintf("%d: must be at least 1", maxNew)}
	}
	// Compare by subtraction so huge values cannot overflow.
	if contextLength > 0 && (prompt > contextLength || maxNew > contextLength-prompt) {
		return &engine.ContextLengthError{Model: model, Prompt: prompt, MaxNew: maxNew, Limit: contextLength}
	}
	if kvCapacity > 0 && (prompt > kvCapacity || maxNew > kvCapacity-prompt) {
		return &CapacityError{Model: model, Prompt: prompt, MaxNew: maxNew, Capacity: kvCapacity}
	}
	return nil
}

// invalidEntry returns an error wrapping ErrInvalidEntry.
func invalidEntry(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidEntry, fmt.Sprintf(format, args...))
}

// invalidOption returns an error wrapping ErrInvalidOption.
func invalidOption(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidOption, fmt.Sprintf(format, args...))
}

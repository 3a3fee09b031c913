package prewarm

import (
	"errors"
	"fmt"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// Model describes a model to pre-warm or to keep known to a [Manager].
type Model struct {
	// Spec says what to load (ID and Path are required) and how to size it.
	Spec engine.ModelSpec
	// Priority orders pre-warming: higher loads first. It also names the
	// models a [WhileWarming] readiness policy waits for. The zero value is a
	// valid, ordinary priority.
	Priority int
	// Prompts are warm-up prompts: each runs as a short real generation
	// after the engine's own warm-up. None means one generation from a
	// few fixed token ids.
	Prompts []string
	// Pin keeps the model loaded once it is: the Manager never evicts it
	// for memory nor unloads it when idle.
	Pin bool
	// KeepAlive is how long the model stays loaded after its last request
	// ends. Zero means the Manager's default ([DefaultKeepAlive] unless
	// [WithKeepAlive] says otherwise); negative means forever. A request's
	// own keep-alive replaces it, as in Ollama.
	KeepAlive time.Duration
	// MemoryBytes is the memory the model is expected to take once loaded
	// (weights + KV), used to make room before its first load. Zero means
	// the Manager estimates it from the checkpoint's *.safetensors files;
	// after a load, the engine's report replaces the estimate.
	MemoryBytes int64
}

// ID returns the model's id, Spec.ID.
func (m Model) ID() string { return m.Spec.ID }

func (m Model) validate() error {
	switch {
	case m.Spec.ID == "":
		return &engine.InvalidParamError{Param: "model", Reason: "model id is empty"}
	case m.MemoryBytes < 0:
		return &engine.InvalidParamError{Param: "memory_bytes", Reason: fmt.Sprintf("%d: must not be negative", m.MemoryBytes)}
	}
	return nil
}

// Sentinel errors of the package.
var (
	// ErrClosed is returned by a Manager after Close and by a PreWarmer
	// after Stop.
	ErrClosed = fmt.Errorf("prewarm: %w", engine.ErrClosed)
	// ErrBusy is what a Host's Unload returns, with idleOnly set, for a
	// model that has requests queued or running.
	ErrBusy = errors.New("prewarm: model has requests in flight")
	// ErrAborted ends the waiters of a load that an Unload or Close
	// cancelled.
	ErrAborted = retry.NewError(retry.CodeUnavailable, "prewarm: load aborted")
	// ErrLoadFailed is wrapped by every *LoadError.
	ErrLoadFailed = retry.NewError(retry.CodeLoadFailed, "prewarm: model failed to load")
	// ErrOverBudget is wrapped by every *BudgetError.
	ErrOverBudget = retry.NewError(retry.CodeBudgetExhausted, "prewarm: memory budget exhausted")
	// ErrNotReady is wrapped by the error Ready returns when its policy
	// can no longer be met.
	ErrNotReady = errors.New("prewarm: not ready")
	// ErrUnknownModel is wrapped by the error for a model the Manager
	// does not know.
	ErrUnknownModel = retry.NewError(retry.CodeModelNotFound, "prewarm: unknown model")
)

// LoadError is a failed load. Every request that waited for the load gets
// the same *LoadError, and so does every request until RetryAt: the
// Manager does not retry a failed load before then.
type LoadError struct {
	// Model is the model id.
	Model string
	// Attempts counts the consecutive failed loads.
	Attempts int
	// RetryAt is when the next request may try loading again.
	RetryAt time.Time
	// Err is why the load failed (an *engine.CheckpointError, a timeout, ...).
	Err error
}

func (e *LoadError) Error() string {
	return fmt.Sprintf("model %q failed to load (attempt %d; next try after %s): %v",
		e.Model, e.Attempts, e.RetryAt.UTC().Format(time.RFC3339), e.Err)
}

// Unwrap returns ErrLoadFailed and the cause.
func (e *LoadError) Unwrap() []error { return []error{ErrLoadFailed, e.Err} }

// RetryAfter is how long until the model may be tried again.
func (e *LoadError) RetryAfterHint() time.Duration { return max(time.Until(e.RetryAt), time.Second) }

// BudgetError says a model cannot be loaded now: loading it would exceed
// the memory budget and every model that could make room is pinned or
// busy.
type BudgetError struct {
	// Model is the model that could not be loaded.
	Model string
	// Need is the memory it needs, Used the memory the loaded models
	// take, Budget the limit, all in bytes.
	Need, Used, Budget int64
	// Retry is a hint for when to try again.
	Retry time.Duration
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("cannot load model %q: it needs %d bytes, %d of the %d-byte memory budget are in use by models that are pinned or busy",
		e.Model, e.Need, e.Used, e.Budget)
}

// Unwrap returns ErrOverBudget.
func (e *BudgetError) Unwrap() error { return ErrOverBudget }

// RetryAfter is a hint for when to try again.
func (e *BudgetError) RetryAfterHint() time.Duration { return e.Retry }

package engine

import (
	"errors"
	"fmt"

	"github.com/mlxserving/mlxserving/api"
)

// Sentinel errors. Engines wrap them (fmt.Errorf("...: %w", ErrX)) or return
// a typed error whose Unwrap yields one, so callers branch with errors.Is.
var (
	// ErrUnavailable means the engine cannot run here: built without its
	// backend, a missing interpreter or library. The message says what to
	// install.
	ErrUnavailable = errors.New("engine unavailable")
	// ErrModelNotFound means no loaded model has the requested id.
	ErrModelNotFound = errors.New("model not found")
	// ErrBadCheckpoint means a checkpoint is missing files, corrupt, or of
	// an unsupported architecture or format.
	ErrBadCheckpoint = errors.New("bad checkpoint")
	// ErrContextLength means a sequence would exceed the model's context.
	ErrContextLength = errors.New("context length exceeded")
	// ErrOutOfMemory means KV or weight memory could not be allocated now.
	ErrOutOfMemory = errors.New("out of memory")
	// ErrWorkerLost means the process or thread running the model died or
	// stopped answering. The sequences it held are gone; retrying them
	// from the start is safe if nothing was delivered yet.
	ErrWorkerLost = errors.New("engine worker lost")
	// ErrInvalidParam means a request parameter is out of range; it is
	// api.ErrInvalidParam, which every *InvalidParamError wraps.
	ErrInvalidParam = api.ErrInvalidParam
	// ErrClosed means the engine or model was closed.
	ErrClosed = errors.New("engine closed")
	// ErrNotRun means a step sent behind another (Pipeliner) was not run
	// because the step before it failed: it changed no sequence, and the
	// caller plans it again once it has handled that failure.
	ErrNotRun = errors.New("step not run: the step before it failed")
)

// PartialStepError is a Step, or a PendingStep's Wait, that ran some of
// its inputs only. An engine that splits a batch across workers (each
// sequence lives on one) returns it when the workers of some inputs ran
// them while the others' workers left them unchanged: refused them for
// want of memory in their own pool (Err wraps ErrOutOfMemory), or did not
// run them behind a step that failed there (Err wraps ErrNotRun). The
// inputs that ran changed their sequences as a successful Step does and
// Outputs holds their outputs; the others changed nothing.
//
// It wraps neither sentinel, since the step did change sequences: a
// caller that does not look for it treats every sequence of the batch as
// failed, as after any other error, which is safe.
type PartialStepError struct {
	// Ran reports, per input of the batch, whether it ran.
	Ran []bool
	// Outputs holds the outputs of the sampling inputs that ran, in input
	// order, as Step returns them.
	Outputs []StepOutput
	// Err says why the other inputs did not run; it wraps ErrOutOfMemory
	// or ErrNotRun (ErrOutOfMemory when some were refused and others not
	// run: a refusal asks the caller to give blocks back).
	Err error
}

func (e *PartialStepError) Error() string {
	ran := 0
	for _, r := range e.Ran {
		if r {
			ran++
		}
	}
	return fmt.Sprintf("step ran %d of its %d inputs; the others changed nothing: %v", ran, len(e.Ran), e.Err)
}

// ContextLengthError says by how much a sequence overflows the context.
type ContextLengthError struct {
	// Model is the model id.
	Model string
	// Prompt is the number of prompt tokens.
	Prompt int
	// MaxNew is the number of tokens asked for on top of the prompt.
	MaxNew int
	// Limit is the model's context length.
	Limit int
}

func (e *ContextLengthError) Error() string {
	if e.MaxNew > 0 {
		return fmt.Sprintf("context length exceeded: model %q holds %d tokens; the request needs %d (%d prompt + %d to generate)",
			e.Model, e.Limit, e.Prompt+e.MaxNew, e.Prompt, e.MaxNew)
	}
	return fmt.Sprintf("context length exceeded: model %q holds %d tokens; the prompt has %d", e.Model, e.Limit, e.Prompt)
}

// Unwrap returns ErrContextLength.
func (e *ContextLengthError) Unwrap() error { return ErrContextLength }

// CheckpointError names the file (and tensor, if any) a load failed on.
type CheckpointError struct {
	// Path is the file inside the checkpoint, or the directory itself.
	Path string
	// Tensor is the tensor name, if the problem is one tensor.
	Tensor string
	// Reason says what is wrong.
	Reason string
}

func (e *CheckpointError) Error() string {
	if e.Tensor != "" {
		return fmt.Sprintf("bad checkpoint: %s: tensor %q: %s", e.Path, e.Tensor, e.Reason)
	}
	return fmt.Sprintf("bad checkpoint: %s: %s", e.Path, e.Reason)
}

// Unwrap returns ErrBadCheckpoint.
func (e *CheckpointError) Unwrap() error { return ErrBadCheckpoint }

// InvalidParamError names a request parameter and why it was refused;
// the type lives in api beside the parameters it checks.
type InvalidParamError = api.InvalidParamError

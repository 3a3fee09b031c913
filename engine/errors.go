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

package pyproc

import (
	"fmt"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// LostError says why a worker was lost. It wraps engine.ErrWorkerLost, so
// the sequences it held are retryable from the start.
type LostError struct {
	// Worker is the worker's index in the pool.
	Worker int
	// PID is the process id, 0 if it never started.
	PID int
	// Reason says what happened: the exit status, a heartbeat timeout or a
	// protocol violation.
	Reason string
}

func (e *LostError) Error() string {
	return fmt.Sprintf("pyproc: worker %d (pid %d) lost: %s", e.Worker, e.PID, e.Reason)
}

// Unwrap returns engine.ErrWorkerLost.
func (e *LostError) Unwrap() error { return engine.ErrWorkerLost }

// WorkerError is an error a worker reported with a protocol code
// (PROTOCOL.md lists them: the error classification's codes, retry.Code*,
// where it has one). It wraps the matching engine sentinel where there is
// one.
type WorkerError struct {
	Code    string
	Message string
	kind    error
}

func (e *WorkerError) Error() string { return fmt.Sprintf("pyproc: worker: %s: %s", e.Code, e.Message) }

// Unwrap returns the engine sentinel for the code, or nil.
func (e *WorkerError) Unwrap() error { return e.kind }

// wireError is an error reply's "error" object.
type wireError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Path    string `json:"path"`
	Tensor  string `json:"tensor"`
	Reason  string `json:"reason"`
	Prompt  int    `json:"prompt"`
	Limit   int    `json:"limit"`
}

// codeCheckpoint is the code of a checkpoint the worker cannot read, which
// the classification has no code of its own for (it classifies the
// engine.CheckpointError the reply becomes).
const codeCheckpoint = "bad_checkpoint"

// workerKinds maps the worker's other codes to the engine's sentinels.
var workerKinds = map[string]error{
	retry.CodeOutOfMemory:     engine.ErrOutOfMemory,
	retry.CodeInvalidValue:    engine.ErrInvalidParam,
	retry.CodeRequestTooLarge: engine.ErrInvalidParam,
	retry.CodeModelNotFound:   engine.ErrModelNotFound,
	retry.CodeUnavailable:     engine.ErrUnavailable,
	codeNotRun:                engine.ErrNotRun,
}

// codeNotRun is the code of a pipelined step the worker did not run
// because the step it was sent behind failed (PROTOCOL.md, "Pipelined
// steps"); the classification has no code of its own for it.
const codeNotRun = "not_run"

// toError maps a worker's error reply to the engine's typed errors.
func (w *wireError) toError(model string) error {
	switch w.Code {
	case codeCheckpoint:
		return &engine.CheckpointError{Path: w.Path, Tensor: w.Tensor, Reason: w.Reason}
	case retry.CodeContextLength:
		return &engine.ContextLengthError{Model: model, Prompt: w.Prompt, Limit: w.Limit}
	}
	return &WorkerError{Code: w.Code, Message: w.Message, kind: workerKinds[w.Code]}
}

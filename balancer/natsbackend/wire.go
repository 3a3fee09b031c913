package natsbackend

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
)

// Headers of a request and of its start reply.
const (
	hdrStream  = "Mlx-Stream"  // request: the client's inbox for chunks
	hdrWindow  = "Mlx-Window"  // request: the initial credit, in chunks
	hdrKind    = "Mlx-Kind"    // reply: "start" or "error"
	hdrControl = "Mlx-Control" // reply: where the client sends credit and cancel
	hdrTimeout = "Mlx-Timeout" // embed request: the time the caller has left, a Go duration
)

// Stream message kinds, the first byte of each message on the inbox.
const (
	msgChunk     = 'c'
	msgError     = 'e'
	msgHeartbeat = 'h'
	msgEmbed     = 'v' // a part of an embed request's vectors
)

// Control message kinds, the first byte of each message on the control
// subject.
const (
	ctlCredit = 'a'
	ctlCancel = 'x'
)

// wireChunk is an api.Chunk on the wire.
type wireChunk struct {
	Text     string           `json:"t,omitempty"`
	Token    int32            `json:"k,omitempty"`
	HasToken bool             `json:"h,omitempty"`
	Logprob  float32          `json:"l,omitempty"`
	Finish   api.FinishReason `json:"f,omitempty"`
	Usage    *api.Usage       `json:"u,omitempty"`
}

// wireError is an error on the wire, typed enough for the client to
// classify it as the instance did.
type wireError struct {
	Code       string        `json:"code"`
	Message    string        `json:"message"`
	Param      string        `json:"param,omitempty"`
	RetryAfter time.Duration `json:"retry_after,omitempty"`
	Retryable  bool          `json:"retryable"`
	// Context carries a context-length refusal's numbers, so the client
	// gets the same *engine.ContextLengthError the instance returned.
	Context *engine.ContextLengthError `json:"context,omitempty"`
	// Deadline is the request deadline that fired (code "deadline").
	Deadline *retry.DeadlineError `json:"deadline,omitempty"`
}

// Error codes.
const (
	codeModelNotFound = "model_not_found"
	codeInvalidParam  = "invalid_param"
	codeContextLength = "context_length"
	codeQueueFull     = "queue_full"
	codeRateLimited   = "rate_limited"
	codeBadRequest    = "bad_request"
	codeInterrupted   = "interrupted"
	codeDeadline      = "deadline"
	codeInternal      = "internal"
)

func toWire(err error) wireError {
	w := wireError{Message: err.Error(), Code: codeInternal}
	var ip *engine.InvalidParamError
	var ie *retry.InterruptedError
	var cl *engine.ContextLengthError
	var de *retry.DeadlineError
	switch {
	case errors.Is(err, engine.ErrModelNotFound):
		w.Code = codeModelNotFound
	case errors.As(err, &ip):
		w.Code, w.Param = codeInvalidParam, ip.Param
	case errors.Is(err, engine.ErrInvalidParam):
		w.Code = codeInvalidParam
	case errors.As(err, &cl):
		w.Code, w.Context = codeContextLength, cl
	case errors.Is(err, engine.ErrContextLength):
		w.Code = codeContextLength
	case errors.Is(err, scheduler.ErrQueueFull):
		w.Code = codeQueueFull
	case errors.Is(err, scheduler.ErrRateLimited):
		w.Code = codeRateLimited
	case errors.As(err, &ie):
		w.Code = codeInterrupted
	case errors.As(err, &de):
		w.Code, w.Deadline = codeDeadline, de
	}
	c := retry.Classify(err)
	w.Retryable, w.RetryAfter = c.Retryable(), c.RetryAfter
	return w
}

func marshalError(kind byte, err error) []byte {
	b, _ := json.Marshal(toWire(err))
	return append([]byte{kind}, b...)
}

// errEOF marks a stream that ended with its final chunk; endErr reports it
// as io.EOF.
var errEOF = errors.New("natsbackend: stream ended")

package natsbackend

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/wireerr"
	"github.com/mlxserving/mlxserving/retry"
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
// classify it as the instance did: Code is the instance's classification
// of it (retry.Classify), one of retry's Code constants.
type wireError struct {
	Code       string        `json:"code"`
	Message    string        `json:"message"`
	Param      string        `json:"param,omitempty"`
	RetryAfter time.Duration `json:"retry_after,omitempty"`
	Retryable  bool          `json:"retryable"`
	// Context carries a context-length refusal's numbers, so the client
	// gets the same *engine.ContextLengthError the instance returned.
	Context *engine.ContextLengthError `json:"context,omitempty"`
	// Deadline is the request deadline that fired, with its limit.
	Deadline *retry.DeadlineError `json:"deadline,omitempty"`
}

// legacyCodes are the codes instances of earlier versions sent, by the
// code of retry's they stand for; "deadline" is read from the deadline
// the message carries.
var legacyCodes = map[string]string{
	"invalid_param":  retry.CodeInvalidValue,
	"bad_request":    retry.CodeInvalidValue,
	"context_length": retry.CodeContextLength,
	"rate_limited":   retry.CodeRateLimited,
	"interrupted":    retry.CodeInterrupted,
	"internal":       retry.CodeInternal,
}

// code returns the retry code w stands for, reading an earlier version's
// codes too.
func (w wireError) code() string {
	if c, ok := legacyCodes[w.Code]; ok {
		return c
	}
	if w.Code == "deadline" {
		if w.Deadline == nil {
			return retry.CodeTotalDeadline
		}
		return retry.Classify(w.Deadline).Code
	}
	return w.Code
}

func toWire(err error) wireError {
	f := wireerr.Of(err)
	return wireError{Code: f.Code, Message: f.Message, Param: f.Param, RetryAfter: f.RetryAfter,
		Retryable: retry.Classify(err).Retryable(), Context: f.Context, Deadline: f.Deadline}
}

func marshalError(kind byte, err error) []byte {
	b, _ := json.Marshal(toWire(err))
	return append([]byte{kind}, b...)
}

// errEOF marks a stream that ended with its final chunk; endErr reports it
// as io.EOF.
var errEOF = errors.New("natsbackend: stream ended")

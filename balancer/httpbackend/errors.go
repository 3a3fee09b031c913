package httpbackend

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/wireerr"
	"github.com/mlxserving/mlxserving/retry"
)

var (
	// ErrClosed is returned by requests on a closed Backend.
	ErrClosed = fmt.Errorf("httpbackend: backend: %w", engine.ErrClosed)
	// ErrTruncated means the upstream's stream ended before its final
	// chunk: the connection closed or [DONE] came without a finish reason.
	ErrTruncated = errors.New("httpbackend: stream ended before its final chunk")
	// ErrHeaderTimeout means the upstream sent no response headers within
	// the header timeout.
	ErrHeaderTimeout = errors.New("httpbackend: no response headers in time")
	// ErrNoResume refuses a request carrying api.Params.Resume on a
	// backend without WithResume (a foreign upstream cannot resume); a
	// load balancer takes it to another backend.
	ErrNoResume = errors.New("httpbackend: the upstream cannot resume a stream (not WithResume)")
)

// Error is a request the upstream did not serve: it could not be reached,
// answered with an HTTP error status, or broke its stream before any text
// reached the caller. Nothing was streamed, so the request may be sent
// elsewhere when Retryable says so.
//
// It unwraps to Err (the transport failure, ErrTruncated, a
// *ProtocolError, ...), to a *retry.StatusError when the upstream answered
// with a status, and to the typed error for the upstream's error code
// where there is one (an *engine.InvalidParamError, an
// *engine.ContextLengthError, a *scheduler.QueueFullError, a
// *scheduler.RateLimitError, a *retry.DeadlineError,
// engine.ErrModelNotFound, ...), so callers classify it as they would a
// local error.
type Error struct {
	// URL is the endpoint the request went to.
	URL string
	// Status is the HTTP status; 0 when no error response arrived.
	Status int
	// RetryAfter is the upstream's Retry-After; 0 when it sent none.
	RetryAfter time.Duration
	// Type, Code and Param are the upstream's error fields, if its body
	// was an OpenAI-shaped error. An mlxserving upstream's Code is its
	// classification of the error, one of package retry's codes.
	Type, Code, Param string
	// Message is the upstream's error message, if it gave one.
	Message string
	// Context holds a context-length refusal's numbers when the upstream
	// sent them (mlxserving's error object does); nil otherwise.
	Context *engine.ContextLengthError
	// Err is the underlying failure when the upstream sent no status.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "httpbackend: %s: ", e.URL)
	switch {
	case e.Status != 0:
		fmt.Fprintf(&b, "%d %s", e.Status, http.StatusText(e.Status))
		if e.Message != "" {
			b.WriteString(": " + e.Message)
		}
	case e.Message != "":
		b.WriteString(e.Message)
	case e.Err != nil:
		b.WriteString(e.Err.Error())
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, " (retry after %v)", e.RetryAfter)
	}
	return b.String()
}

// Retryable reports whether the request may be tried again, here or on
// another backend: the upstream could not be reached, timed out or broke
// its stream before any text, or its status is retryable as
// retry.Classify decides (a 429 or 503 with a Retry-After). Other
// statuses (a bad request, an unknown model, a context too long, a 429
// that gives no Retry-After) are not.
func (e *Error) Retryable() bool {
	if e.Status == 0 {
		return true
	}
	return retry.Classify(&retry.StatusError{Code: e.Status, RetryAfter: e.RetryAfter}).Retryable()
}

// RetryAfterHint returns RetryAfter.
func (e *Error) RetryAfterHint() time.Duration { return e.RetryAfter }

// Unwrap returns Err, a *retry.StatusError for the status, and the typed
// error the upstream's code stands for when it is one of retry's codes
// (mlxserving's HTTP API sends them); for a foreign upstream's,
// engine.ErrModelNotFound for a 404 and an *engine.InvalidParamError for
// a 400.
func (e *Error) Unwrap() []error {
	var errs []error
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	if e.Status != 0 {
		errs = append(errs, &retry.StatusError{Code: e.Status, RetryAfter: e.RetryAfter, Message: e.Message})
	}
	f := wireerr.Fields{Code: e.Code, Message: e.Message, Param: e.Param, RetryAfter: e.RetryAfter, Context: e.Context}
	if typed := f.Err(); typed != nil {
		return append(errs, typed)
	}
	switch e.Status {
	case http.StatusNotFound:
		errs = append(errs, engine.ErrModelNotFound)
	case http.StatusBadRequest:
		errs = append(errs, &engine.InvalidParamError{Param: e.Param, Reason: e.Message})
	}
	return errs
}

// ProtocolError is an upstream response that is not OpenAI-compatible
// streaming: a wrong content type, a malformed event, an over-long line.
type ProtocolError struct {
	// Detail says what was wrong.
	Detail string
	// Data is the start of the offending data, at most 200 bytes.
	Data string
}

func (e *ProtocolError) Error() string {
	if e.Data == "" {
		return "httpbackend: bad response from upstream: " + e.Detail
	}
	return fmt.Sprintf("httpbackend: bad response from upstream: %s: %q", e.Detail, e.Data)
}

func protocolError(detail string, data []byte) *ProtocolError {
	if len(data) > 200 {
		data = data[:200]
	}
	return &ProtocolError{Detail: detail, Data: string(data)}
}

// StreamError is an error event the upstream sent inside its stream, after
// the response had started. Like an *Error it unwraps to the typed error
// the upstream's code stands for (a *retry.DeadlineError for a deadline
// that fired mid-stream, an *engine.InvalidParamError, ...), so callers
// classify it as they would a local error.
type StreamError struct {
	// Type, Code and Param are the event's error fields; an mlxserving
	// upstream's Code is its classification of the error, one of package
	// retry's codes.
	Type, Code, Param string
	// Message is the upstream's error message.
	Message string
	// Context holds a context-length refusal's numbers when the upstream
	// sent them; nil otherwise.
	Context *engine.ContextLengthError
}

func (e *StreamError) Error() string {
	return fmt.Sprintf("httpbackend: upstream failed mid-stream (%s %s): %s", e.Type, e.Code, e.Message)
}

// Unwrap returns the typed error Code stands for when it is one of
// retry's codes; nil otherwise.
func (e *StreamError) Unwrap() error {
	f := wireerr.Fields{Code: e.Code, Message: e.Message, Param: e.Param, Context: e.Context}
	return f.Err()
}

// errorBody is an OpenAI-shaped error ({"error": {...}}), or vLLM's older
// flat shape ({"object": "error", "message": ..., "type": ..., "code": 400}).
type errorBody struct {
	Error   json.RawMessage `json:"error"`
	Message string          `json:"message"`
	Type    string          `json:"type"`
}

type errorFields struct {
	Message string          `json:"message"`
	Type    string          `json:"type"`
	Param   *string         `json:"param"`
	Code    json.RawMessage `json:"code"`
	Context *struct {
		Prompt int `json:"prompt_tokens"`
		MaxNew int `json:"max_tokens"`
		Limit  int `json:"context_length"`
	} `json:"context"`
}

// details returns the error object's code (when it is a string), param,
// and context-length numbers (with the context-length code).
func (f *errorFields) details() (code, param string, context *engine.ContextLengthError) {
	_ = json.Unmarshal(f.Code, &code)
	if f.Param != nil {
		param = *f.Param
	}
	if c := f.Context; c != nil && code == retry.CodeContextLength && c.Limit > 0 {
		context = &engine.ContextLengthError{Prompt: c.Prompt, MaxNew: c.MaxNew, Limit: c.Limit}
	}
	return code, param, context
}

// statusError builds the *Error for a non-2xx response with body b.
func statusError(url string, resp *http.Response, b []byte) *Error {
	e := &Error{URL: url, Status: resp.StatusCode, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	var body errorBody
	if json.Unmarshal(b, &body) == nil {
		var f errorFields
		switch {
		case len(body.Error) > 0 && body.Error[0] == '{' && json.Unmarshal(body.Error, &f) == nil:
			e.Message, e.Type = f.Message, f.Type
			e.Code, e.Param, e.Context = f.details()
		case len(body.Error) > 0 && body.Error[0] == '"':
			_ = json.Unmarshal(body.Error, &e.Message) // llama.cpp/Ollama: {"error": "message"}
		default:
			e.Message, e.Type = body.Message, body.Type
		}
	}
	if e.Message == "" {
		msg := strings.TrimSpace(string(b))
		if len(msg) > 200 {
			msg = msg[:200]
		}
		e.Message = msg
	}
	return e
}

// parseRetryAfter reads a Retry-After header: seconds, or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

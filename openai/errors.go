package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/session"
)

// Error types, the "type" field of an error body, for the answers the
// handlers write themselves (retry.Class.Type gives the library errors').
const (
	typeInvalidRequest = "invalid_request_error"
	typeNotFound       = "not_found_error"
	typeRateLimit      = "rate_limit_error"
)

// apiError is an error as the HTTP API reports it.
type apiError struct {
	status     int
	retryAfter time.Duration
	Message    string  `json:"message"`
	Type       string  `json:"type"`
	Param      *string `json:"param"`
	Code       *string `json:"code"`
	// Context carries a context-length refusal's numbers (an extension
	// of OpenAI's error object), so a gateway in front of this server can
	// fit a request that gave no max_tokens as the server itself would.
	Context *contextNumbers `json:"context,omitempty"`
}

// contextNumbers are an *engine.ContextLengthError's numbers on the wire.
type contextNumbers struct {
	Prompt int `json:"prompt_tokens"`
	MaxNew int `json:"max_tokens"`
	Limit  int `json:"context_length"`
}

func (e *apiError) Error() string { return e.Message }

// badRequest is a 400 naming the parameter at fault ("" for none).
func badRequest(param, code, format string, args ...any) *apiError {
	return newAPIError(http.StatusBadRequest, typeInvalidRequest, param, code, fmt.Sprintf(format, args...))
}

func newAPIError(status int, typ, param, code, msg string) *apiError {
	e := &apiError{status: status, Type: typ, Message: msg}
	if param != "" {
		e.Param = &param
	}
	if code != "" {
		e.Code = &code
	}
	return e
}

// toAPIError maps the library's errors to statuses: retry.Classify gives
// the status, type, code and Retry-After; errorDetails names the
// parameter at fault and refines the message.
func toAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	c := retry.Classify(err)
	param, msg := errorDetails(err, c)
	status := Status(c)
	e := newAPIError(status, errorType(status), param, c.Code, msg)
	e.retryAfter = c.RetryAfter
	if c.Code == retry.CodeWorkerLost && e.retryAfter == 0 {
		e.retryAfter = time.Second
	}
	var ctxLen *engine.ContextLengthError
	if c.Kind == retry.ContextLength && errors.As(err, &ctxLen) {
		e.Context = &contextNumbers{Prompt: ctxLen.Prompt, MaxNew: ctxLen.MaxNew, Limit: ctxLen.Limit}
	}
	return e
}

// errorDetails returns the request parameter at fault for err of class c
// ("" for none) and the message the caller sees.
func errorDetails(err error, c retry.Class) (param, msg string) {
	var (
		invalid  *engine.InvalidParamError
		notFound *mlxserving.ModelNotFoundError
		tooBig   *bodyTooLargeError
	)
	msg = err.Error()
	switch {
	case errors.As(err, &tooBig):
		return "", tooBig.Error()
	case errors.As(err, &notFound):
		// Only the name the caller sent: which models are loaded is not
		// for every key to see (GET /v1/models lists the key's own).
		return "model", fmt.Sprintf("model %q not found", notFound.Model)
	case c.Code == retry.CodeInvalidValue && errors.As(err, &invalid) && invalid.Param != "":
		return invalid.Param, msg
	case errors.Is(err, session.ErrInvalidID):
		return "session_id", msg
	case errors.Is(err, api.ErrUnknownTier):
		return "priority", msg
	case errors.Is(err, prewarm.ErrAborted):
		return "model", msg
	}
	return codeParams[c.Code], msg
}

// codeParams names the parameter at fault for the codes that have one.
var codeParams = map[string]string{
	retry.CodeContextLength:     "messages",
	retry.CodeTemplate:          "messages",
	retry.CodeExceedsKVCapacity: "max_tokens",
	retry.CodeModelNotFound:     "model",
	retry.CodeUnsupportedModel:  "model",
	retry.CodeNoBackend:         "model",
	retry.CodeBudgetExhausted:   "model",
	retry.CodeLoadFailed:        "model",
}

// writeError writes err as an OpenAI-shaped error body. A refusal that
// says when to come back (retry.RetryAfter) sends Retry-After, and so does
// every 503: a client's retry loop needs to know when to try again.
func writeError(w http.ResponseWriter, err error) {
	e := toAPIError(err)
	if e.retryAfter == 0 && e.status >= 429 {
		if d, ok := retry.RetryAfter(err); ok {
			e.retryAfter = d
		}
	}
	if e.retryAfter == 0 && e.status == http.StatusServiceUnavailable {
		e.retryAfter = time.Second
	}
	if e.retryAfter > 0 {
		secs := int(math.Ceil(e.retryAfter.Seconds()))
		w.Header().Set("Retry-After", strconv.Itoa(secs))
	}
	writeJSON(w, e.status, errorBody{Error: e})
}

type errorBody struct {
	Error *apiError `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"message":"cannot encode response","type":"server_error","param":null,"code":null}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

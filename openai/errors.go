package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/tokenizer"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
	"github.com/mlxserving/mlxserving/session"
)

// Error types, the "type" field of an error body.
const (
	typeInvalidRequest = "invalid_request_error"
	typeNotFound       = "not_found_error"
	typeRateLimit      = "rate_limit_error"
	typeOverloaded     = "overloaded_error"
	typeServer         = "server_error"
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

// toAPIError maps the library's errors to statuses: the one table the
// package doc describes.
func toAPIError(err error) *apiError {
	var (
		ae       *apiError
		invalid  *engine.InvalidParamError
		ctxLen   *engine.ContextLengthError
		notFound *mlxserving.ModelNotFoundError
		full     *scheduler.QueueFullError
		limited  *scheduler.RateLimitError
		tooBig   *http.MaxBytesError
		capacity *scheduler.CapacityError
		deadline *retry.DeadlineError
		broken   *retry.InterruptedError
		budget   *prewarm.BudgetError
		load     *prewarm.LoadError
		noBack   *balancer.NoBackendError
	)
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &noBack):
		// Before anything below: the last backend's error is wrapped too,
		// but the request's fate is that no backend could take it.
		e := newAPIError(http.StatusServiceUnavailable, typeOverloaded, "model", "no_backend_available", err.Error())
		e.retryAfter = noBack.RetryAfter
		return e
	case errors.As(err, &budget):
		e := newAPIError(http.StatusServiceUnavailable, typeOverloaded, "model", "memory_budget_exhausted", err.Error())
		e.retryAfter = budget.RetryAfterHint()
		return e
	case errors.As(err, &load):
		e := newAPIError(http.StatusServiceUnavailable, typeOverloaded, "model", "model_load_failed", err.Error())
		e.retryAfter = load.RetryAfterHint()
		return e
	case errors.Is(err, prewarm.ErrAborted):
		return newAPIError(http.StatusServiceUnavailable, typeOverloaded, "model", "unavailable", err.Error())
	case errors.As(err, &tooBig):
		return newAPIError(http.StatusRequestEntityTooLarge, typeInvalidRequest, "", "request_too_large",
			fmt.Sprintf("request body is larger than the %d-byte limit", tooBig.Limit))
	case errors.As(err, &ctxLen):
		e := newAPIError(http.StatusBadRequest, typeInvalidRequest, "messages", "context_length_exceeded", ctxLen.Error())
		e.Context = &contextNumbers{Prompt: ctxLen.Prompt, MaxNew: ctxLen.MaxNew, Limit: ctxLen.Limit}
		return e
	case errors.Is(err, engine.ErrContextLength): // an upstream's, without numbers
		return newAPIError(http.StatusBadRequest, typeInvalidRequest, "messages", "context_length_exceeded", err.Error())
	case errors.As(err, &capacity):
		return newAPIError(http.StatusBadRequest, typeInvalidRequest, "max_tokens", "exceeds_kv_capacity", capacity.Error())
	case errors.Is(err, tokenizer.ErrTemplate):
		return newAPIError(http.StatusBadRequest, typeInvalidRequest, "messages", "template_error", err.Error())
	case errors.As(err, &invalid):
		return newAPIError(http.StatusBadRequest, typeInvalidRequest, invalid.Param, "invalid_value", invalid.Error())
	case errors.Is(err, session.ErrInvalidID):
		return newAPIError(http.StatusBadRequest, typeInvalidRequest, "session_id", "invalid_value", err.Error())
	case errors.Is(err, api.ErrUnknownTier):
		return newAPIError(http.StatusBadRequest, typeInvalidRequest, "priority", "invalid_value", err.Error())
	case errors.As(err, &notFound):
		// Only the name the caller sent: which models are loaded is not
		// for every key to see (GET /v1/models lists the key's own).
		return newAPIError(http.StatusNotFound, typeNotFound, "model", "model_not_found",
			fmt.Sprintf("model %q not found", notFound.Model))
	case errors.Is(err, engine.ErrModelNotFound):
		return newAPIError(http.StatusNotFound, typeNotFound, "model", "model_not_found", err.Error())
	case errors.Is(err, mlxserving.ErrNoTokenizer):
		return newAPIError(http.StatusBadRequest, typeInvalidRequest, "model", "unsupported_model", err.Error())
	case errors.As(err, &full):
		e := newAPIError(http.StatusTooManyRequests, typeRateLimit, "", "queue_full", err.Error())
		e.retryAfter = full.RetryAfter
		return e
	case errors.As(err, &limited):
		e := newAPIError(http.StatusTooManyRequests, typeRateLimit, "", "rate_limit_exceeded", err.Error())
		e.retryAfter = limited.RetryAfter
		return e
	case errors.Is(err, scheduler.ErrQueueFull), errors.Is(err, scheduler.ErrRateLimited):
		return newAPIError(http.StatusTooManyRequests, typeRateLimit, "", "rate_limit_exceeded", err.Error())
	case errors.As(err, &deadline):
		return newAPIError(http.StatusGatewayTimeout, typeServer, "", deadlineCodes[deadline.Kind], err.Error())
	case errors.As(err, &broken):
		return newAPIError(http.StatusBadGateway, typeServer, "", "stream_interrupted", err.Error())
	case errors.Is(err, engine.ErrWorkerLost), errors.Is(err, retry.ErrBreakerOpen):
		e := newAPIError(http.StatusServiceUnavailable, typeOverloaded, "", "worker_unavailable", err.Error())
		e.retryAfter = time.Second
		return e
	case errors.Is(err, engine.ErrOutOfMemory):
		return newAPIError(http.StatusServiceUnavailable, typeOverloaded, "", "out_of_memory", err.Error())
	case errors.Is(err, engine.ErrUnavailable), errors.Is(err, mlxserving.ErrModelUnloaded),
		errors.Is(err, engine.ErrClosed): // every package's closed error wraps it
		return newAPIError(http.StatusServiceUnavailable, typeOverloaded, "", "unavailable", err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return newAPIError(http.StatusGatewayTimeout, typeServer, "", "timeout", err.Error())
	default:
		return newAPIError(http.StatusInternalServerError, typeServer, "", "engine_error", err.Error())
	}
}

// deadlineCodes are the error codes of the request deadlines.
var deadlineCodes = map[retry.DeadlineKind]string{
	retry.FirstToken: "time_to_first_token_exceeded",
	retry.Stall:      "stall_timeout",
	retry.Total:      "request_timeout",
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

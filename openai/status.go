package openai

import (
	"fmt"
	"net/http"

	"github.com/mlxserving/mlxserving/retry"
)

// Status is the HTTP status the handler answers an error of class c
// with: the one place where the serving stack's classification
// (retry.Classify) becomes HTTP. A remote transport that speaks HTTP
// (httpbackend) reads it back from the error code the body carries.
func Status(c retry.Class) int {
	switch c.Kind {
	case retry.OK:
		return http.StatusOK
	case retry.Invalid:
		if c.Code == retry.CodeRequestTooLarge {
			return http.StatusRequestEntityTooLarge
		}
		return http.StatusBadRequest
	case retry.ContextLength:
		return http.StatusBadRequest
	case retry.NotFound:
		return http.StatusNotFound
	case retry.Overloaded:
		if c.Code == retry.CodeQueueFull || c.Code == retry.CodeRateLimited {
			return http.StatusTooManyRequests
		}
		return http.StatusServiceUnavailable
	case retry.Unavailable:
		return http.StatusServiceUnavailable
	case retry.Deadline:
		return http.StatusGatewayTimeout
	case retry.Canceled:
		return 499 // client closed request (nginx); nobody reads it
	case retry.Interrupted:
		return http.StatusBadGateway
	}
	return http.StatusInternalServerError
}

// errorType is the OpenAI error type of an error body with HTTP status
// status.
func errorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return typeInvalidRequest
	case http.StatusNotFound:
		return typeNotFound
	case http.StatusTooManyRequests:
		return typeRateLimit
	case http.StatusServiceUnavailable:
		return "overloaded_error"
	}
	return "server_error"
}

// bodyTooLargeError is a request body over the handler's limit; it
// classifies as retry.CodeRequestTooLarge.
type bodyTooLargeError struct{ limit int64 }

func (e *bodyTooLargeError) Error() string {
	return fmt.Sprintf("request body is larger than the %d-byte limit", e.limit)
}

// ErrorCode returns retry.CodeRequestTooLarge.
func (e *bodyTooLargeError) ErrorCode() string { return retry.CodeRequestTooLarge }

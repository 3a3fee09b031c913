package balancer

import (
	"fmt"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// ErrClosed means the balancer was closed and routes no new requests. It
// wraps engine.ErrClosed, as every closed error of the module does.
var ErrClosed = fmt.Errorf("balancer: %w", engine.ErrClosed)

// ErrNoBackend is returned when no healthy backend serves a request's
// model. It is wrapped by *NoBackendError, which carries RetryAfter.
var ErrNoBackend = retry.NewError(retry.CodeNoBackend, "no backend available")

// NoBackendError reports that every backend able to serve Model is down,
// ejected, draining or has refused the request.
type NoBackendError struct {
	// Model is the requested model.
	Model string
	// Tried is how many backends were attempted.
	Tried int
	// RetryAfter is when one is expected back (the soonest ejection end or
	// health-check interval).
	RetryAfter time.Duration
	// Last is the last backend error, if any.
	Last error
}

func (e *NoBackendError) Error() string {
	msg := fmt.Sprintf("no backend available for model %q (tried %d), retry after %s", e.Model, e.Tried, e.RetryAfter)
	if e.Last != nil {
		msg += ": " + e.Last.Error()
	}
	return msg
}

// RetryAfterHint returns RetryAfter (see retry.RetryAfter).
func (e *NoBackendError) RetryAfterHint() time.Duration { return e.RetryAfter }

// Unwrap returns ErrNoBackend and the last backend error.
func (e *NoBackendError) Unwrap() []error {
	if e.Last == nil {
		return []error{ErrNoBackend}
	}
	return []error{ErrNoBackend, e.Last}
}

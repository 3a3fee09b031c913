package scheduler

import (
	"context"
	"fmt"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/retry"
)

// Backend is what a [LoadBalancer] routes requests to: the request API of
// one serving instance. A local *mlxserving.Server implements it, so do the
// remote backends (an OpenAI-compatible HTTP upstream, an instance reached
// over NATS) and the LoadBalancer itself, so balancers nest.
//
// Generate and Chat validate and queue the request before they return,
// as a Server does: an error means nothing was started.
type Backend interface {
	Generate(ctx context.Context, req api.Request) (*api.Stream, error)
	Chat(ctx context.Context, req api.ChatRequest) (*api.Stream, error)
	// Load reports the backend's current load and models. It must not
	// block on the network: a remote backend returns what it last saw.
	Load() Load
}

// Load is a backend's load report, the signals routing strategies weigh.
type Load struct {
	// Models are the ids the backend serves now (loaded, or known and
	// loadable on demand).
	Models []string
	// Waiting is the number of requests queued, Running the number of
	// sequences in running batches.
	Waiting, Running int
	// KVUsage is the fraction of KV cache capacity in use, 0 to 1.
	KVUsage float64
	// MaxBatch is the most sequences the backend runs at once (summed over
	// its models); 0 when unknown.
	MaxBatch int
	// Updated is when the report was taken; zero for a live local report.
	Updated time.Time
	// Draining is set while the backend finishes what it has before it
	// stops (natsbackend's Service.Drain): balancers route nothing new
	// to it.
	Draining bool `json:",omitempty"`
}

// Serves reports whether model is among l.Models.
func (l Load) Serves(model string) bool {
	for _, m := range l.Models {
		if m == model {
			return true
		}
	}
	return false
}

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

// Unwrap returns ErrNoBackend and the last backend error.
// RetryAfterHint returns RetryAfter (see retry.RetryAfter).
func (e *NoBackendError) RetryAfterHint() time.Duration { return e.RetryAfter }

func (e *NoBackendError) Unwrap() []error {
	if e.Last == nil {
		return []error{ErrNoBackend}
	}
	return []error{ErrNoBackend, e.Last}
}

package balancer

import (
	"context"
	"time"

	"github.com/mlxserving/mlxserving/api"
)

// Backend is what a [LoadBalancer] routes requests to: the request API of
// one serving instance. A local *mlxserving.Server implements it, so do the
// remote backends (an OpenAI-compatible HTTP upstream, an instance reached
// over NATS) and the LoadBalancer itself, so balancers nest.
//
// Generate and Chat validate and queue the request before they return,
// as a Server does: an error means nothing was started. Embed is one
// call: it returns the vectors or why there are none.
type Backend interface {
	Generate(ctx context.Context, req api.Request) (*api.Stream, error)
	Chat(ctx context.Context, req api.ChatRequest) (*api.Stream, error)
	// Embed returns one vector per input of req, in order. Like Generate
	// it refuses bad input before anything runs.
	Embed(ctx context.Context, req api.EmbedRequest) (*api.Embeddings, error)
	// Load reports the backend's current load and models. It must not
	// block on the network: a remote backend returns what it last saw.
	// A LoadBalancer calls it when it rebuilds its routing snapshot (every
	// refresh interval, and when backends come and go), never on a
	// request's path.
	Load() Load
}

// LoadReporter is a backend whose load reports arrive from elsewhere (a
// remote instance's, over the network). The balancer registers a function
// with OnLoad and updates its routing snapshot with each report as it
// arrives rather than at the next refresh; the backend calls it before
// its Load returns the report, and without holding a lock its Load takes.
type LoadReporter interface {
	OnLoad(report func(Load))
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

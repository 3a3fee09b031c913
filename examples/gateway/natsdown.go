package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
)

// natsDownRetryAfter is the wait a request refused while NATS is down is
// told: about what a reconnection attempt takes.
const natsDownRetryAfter = time.Second

// natsState follows the gateway's NATS connection through its handlers:
// when it went down, 0 while it is up.
type natsState struct {
	downSince atomic.Int64 // unix ns
}

// options are the nats.Connect options that keep s up to date.
func (s *natsState) options() []nats.Option {
	return []nats.Option{
		nats.DisconnectErrHandler(func(*nats.Conn, error) { s.downSince.CompareAndSwap(0, time.Now().UnixNano()) }),
		nats.ReconnectHandler(func(*nats.Conn) { s.downSince.Store(0) }),
		nats.ClosedHandler(func(*nats.Conn) { s.downSince.CompareAndSwap(0, time.Now().UnixNano()) }),
	}
}

// downFor is how long the connection has been down; 0 while it is up.
func (s *natsState) downFor() time.Duration {
	since := s.downSince.Load()
	if since == 0 {
		return 0
	}
	return time.Since(time.Unix(0, since))
}

// natsGuard is the gateway's balancer when NATS is its only way to
// instances (no -upstream): while the connection has been down longer
// than the reconnect grace, a request is refused at once — the OpenAI
// handler answers 503 with Retry-After — instead of waiting for the
// grace on every instance still registered, or for an instance to be
// added once discovery dropped them all. Within the grace requests go
// on as usual (moving to another server of a NATS cluster takes
// milliseconds).
type natsGuard struct {
	*balancer.LoadBalancer
	nc    *nats.Conn
	state *natsState
	grace time.Duration
}

// Generate refuses the request while NATS is down, else balances it.
func (g *natsGuard) Generate(ctx context.Context, req api.Request) (*api.Stream, error) {
	if err := g.down(req.Model); err != nil {
		return nil, err
	}
	return g.LoadBalancer.Generate(ctx, req)
}

// Chat refuses the request while NATS is down, else balances it.
func (g *natsGuard) Chat(ctx context.Context, req api.ChatRequest) (*api.Stream, error) {
	if err := g.down(req.Model); err != nil {
		return nil, err
	}
	return g.LoadBalancer.Chat(ctx, req)
}

// Embed refuses the request while NATS is down, else balances it.
func (g *natsGuard) Embed(ctx context.Context, req api.EmbedRequest) (*api.Embeddings, error) {
	if err := g.down(req.Model); err != nil {
		return nil, err
	}
	return g.LoadBalancer.Embed(ctx, req)
}

// down returns the refusal while NATS has been down past the grace.
func (g *natsGuard) down(model string) error {
	d := g.state.downFor()
	if d == 0 || d < g.grace || g.nc.Status() == nats.CONNECTED {
		return nil
	}
	return &balancer.NoBackendError{Model: model, RetryAfter: natsDownRetryAfter,
		Last: fmt.Errorf("%w: the gateway's NATS connection is %s, down for %v", natsbackend.ErrNotConnected, g.nc.Status(), d.Round(time.Millisecond))}
}

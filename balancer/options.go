package balancer

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/mlxserving/mlxserving/retry"
)

// Option configures a LoadBalancer.
type Option func(*config) error

type config struct {
	strategy          Strategy
	maxAttempts       int
	healthInterval    time.Duration
	healthTimeout     time.Duration
	breakerOpts       []retry.BreakerOption
	affinity          AffinityStore
	affinityTTL       time.Duration
	affinityTimeout   time.Duration
	affinityBounds    AffinityBounds
	affinityRefresh   time.Duration
	loadRefresh       time.Duration
	prefixChunks      int
	refusedRetryAfter time.Duration
	backendWait       time.Duration
	logger            *slog.Logger
	meterProvider     metric.MeterProvider
}

// Defaults of a LoadBalancer.
const (
	// DefaultAttempts is how many backends one request may be tried on
	// before its first token.
	DefaultAttempts = 3
	// DefaultHealthInterval is the active health-check interval (Envoy's
	// outlier-detection interval).
	DefaultHealthInterval = 10 * time.Second
	// DefaultEjection is how long a backend whose breaker opened stays
	// out before probes are let through (Envoy's base ejection time).
	DefaultEjection = 30 * time.Second
	// DefaultAffinityTTL is how long a shared session assignment lives
	// without use.
	DefaultAffinityTTL = 30 * time.Minute
	// DefaultAffinityRefresh is how long a balancer uses its own copy of
	// a session's home before it asks the affinity store again.
	DefaultAffinityRefresh = time.Second
	// DefaultPrefixChunks bounds each backend's approximate prefix index
	// (llm-d's per-server LRU of 31,250 blocks).
	DefaultPrefixChunks = 31250
	// DefaultBackendWait is how long a request that finds no backend for
	// its model waits for one to be added before it is refused.
	DefaultBackendWait = 2 * time.Second
)

func defaultConfig() config {
	return config{
		strategy:          Weighted(DefaultWeights),
		maxAttempts:       DefaultAttempts,
		healthInterval:    DefaultHealthInterval,
		healthTimeout:     2 * time.Second,
		breakerOpts:       []retry.BreakerOption{retry.WithOpenTimeout(DefaultEjection), retry.WithFailure(backendFault)},
		affinityTTL:       DefaultAffinityTTL,
		affinityTimeout:   100 * time.Millisecond,
		affinityBounds:    DefaultAffinityBounds,
		affinityRefresh:   DefaultAffinityRefresh,
		loadRefresh:       DefaultLoadRefresh,
		prefixChunks:      DefaultPrefixChunks,
		refusedRetryAfter: time.Second,
		backendWait:       DefaultBackendWait,
		logger:            discardLogger(),
	}
}

// WithStrategy sets the routing strategy. The default is
// Weighted(DefaultWeights).
func WithStrategy(s Strategy) Option {
	return func(c *config) error {
		if s == nil {
			return errors.New("strategy is nil")
		}
		c.strategy = s
		return nil
	}
}

// WithFailoverAttempts sets how many backends a request may be tried on
// before its first token (default 3). 1 turns failover off.
func WithFailoverAttempts(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return errors.New("failover attempts must be at least 1")
		}
		c.maxAttempts = n
		return nil
	}
}

// WithBackendWait sets how long a request that finds no backend serving
// its model — every one that did has left — waits for one to be added
// before it is refused with a *NoBackendError (default 2 s; never past
// the request's context; 0 refuses at once). Backends leave for moments:
// a NATS discovery drops an instance whose connection is moving to
// another node of the cluster and adds it again at its next answer, a
// restarted instance comes back under its name. Requests refused by
// backends that are there (full queues, open breakers) do not wait.
func WithBackendWait(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return errors.New("backend wait must be ≥ 0")
		}
		c.backendWait = d
		return nil
	}
}

// WithHealthCheck sets the interval and timeout of the active health
// checks of backends that implement HealthChecker. An interval of 0 turns
// them off; the default is 10 s with a 2 s timeout.
func WithHealthCheck(interval, timeout time.Duration) Option {
	return func(c *config) error {
		if interval < 0 || timeout <= 0 {
			return errors.New("health check: interval must be ≥ 0 and timeout > 0")
		}
		c.healthInterval, c.healthTimeout = interval, timeout
		return nil
	}
}

// WithBreaker configures each backend's circuit breaker (passive outlier
// ejection). The default opens after 5 consecutive failures (or half of
// 10+ requests in a minute) and stays open 30 s. A bad breaker option
// makes New fail, not Add.
func WithBreaker(opts ...retry.BreakerOption) Option {
	return func(c *config) error {
		if _, err := retry.NewBreaker("check", opts...); err != nil {
			return fmt.Errorf("WithBreaker: %w", err)
		}
		c.breakerOpts = append(c.breakerOpts, opts...)
		return nil
	}
}

// WithAffinityStore shares session → backend assignments through store
// (e.g. Redis, balancer/redisaffinity), so every balancer replica routes
// a session to the same backend. ttl 0 keeps the default, 30 min.
func WithAffinityStore(store AffinityStore, ttl time.Duration) Option {
	return func(c *config) error {
		if store == nil || ttl < 0 {
			return errors.New("affinity store: store is nil or ttl negative")
		}
		c.affinity = store
		if ttl > 0 {
			c.affinityTTL = ttl
		}
		return nil
	}
}

// WithAffinityBounds sets when a session's request leaves its home (see
// AffinityBounds; zero fields keep their defaults). Factors below 1, or a
// move bound below the spill bound, are refused.
func WithAffinityBounds(b AffinityBounds) Option {
	return func(c *config) error {
		b = b.withDefaults()
		if err := b.check(); err != nil {
			return err
		}
		c.affinityBounds = b
		return nil
	}
}

// WithAffinityRefresh sets how long the balancer routes a session by its
// own copy of the session's home before it asks the affinity store again
// (default 1 s). The copy keeps store round trips off the request path: a
// session this balancer has not seen waits for one lookup (bounded by the
// store's 100 ms timeout), a known one is routed at once while an older
// copy is looked up again in the background, and the home's entry is
// written back at most once per interval unless the home changes. A home
// another replica moved is followed within about one interval. It must be
// positive.
func WithAffinityRefresh(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return errors.New("affinity refresh must be positive")
		}
		c.affinityRefresh = d
		return nil
	}
}

// WithLoadRefresh sets how often the routing snapshot is rebuilt from the
// backends' load reports (default 50 ms); adding or removing a backend
// rebuilds it at once. Routing weighs the balancer's own requests in
// flight live, so a snapshot lags only in what other balancers sent. It
// must be positive.
func WithLoadRefresh(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return errors.New("load refresh must be positive")
		}
		c.loadRefresh = d
		return nil
	}
}

// WithPrefixIndexSize bounds each backend's approximate prefix index, in
// 64-byte chunks (default 31,250).
func WithPrefixIndexSize(chunks int) Option {
	return func(c *config) error {
		if chunks < 1 {
			return errors.New("prefix index size must be at least 1")
		}
		c.prefixChunks = chunks
		return nil
	}
}

// WithLogger sets the logger. The default discards.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("logger is nil")
		}
		c.logger = l
		return nil
	}
}

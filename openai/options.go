package openai

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Option configures a Handler.
type Option func(*config) error

type config struct {
	logger         *slog.Logger
	meterProvider  metric.MeterProvider
	maxBody        int64
	defaultMax     int
	metricsHandler http.Handler
	traceHandler   http.Handler
	ready          func(context.Context) error
	keys           []*grant // API keys; none: the handler serves anyone
}

// Defaults.
const (
	// DefaultMaxBodyBytes is the request body limit unless
	// WithMaxBodyBytes says otherwise.
	DefaultMaxBodyBytes = 8 << 20
	// DefaultMaxTokens is how many tokens a request without max_tokens
	// generates at most unless WithDefaultMaxTokens says otherwise.
	DefaultMaxTokens = 1024
)

func defaultConfig() config {
	return config{
		logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		meterProvider: noop.NewMeterProvider(),
		maxBody:       DefaultMaxBodyBytes,
		defaultMax:    DefaultMaxTokens,
	}
}

// WithLogger sets the logger for request failures. The default discards.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("logger is nil")
		}
		c.logger = l
		return nil
	}
}

// WithMeterProvider records the HTTP layer's metrics through mp: requests
// by route and status (mlxserving.http.requests) and their duration
// (mlxserving.http.request.duration). The default records nothing; the
// handler never touches a global registry.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error {
		if mp == nil {
			return errors.New("meter provider is nil")
		}
		c.meterProvider = mp
		return nil
	}
}

// WithMaxBodyBytes limits request bodies; larger ones get 413. It must be
// positive; the default is DefaultMaxBodyBytes.
func WithMaxBodyBytes(n int64) Option {
	return func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("max body bytes %d: must be positive", n)
		}
		c.maxBody = n
		return nil
	}
}

// WithDefaultMaxTokens sets how many tokens a request that gives no
// max_tokens generates at most (less when the model's context has less
// room left). It must be positive; the default is DefaultMaxTokens.
func WithDefaultMaxTokens(n int) Option {
	return func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("default max tokens %d: must be positive", n)
		}
		c.defaultMax = n
		return nil
	}
}

// WithMetricsHandler serves h on GET /metrics, typically a Prometheus
// exporter's handler over the registry the Server's MeterProvider feeds.
// Without it /metrics answers 404.
func WithMetricsHandler(h http.Handler) Option {
	return func(c *config) error {
		if h == nil {
			return errors.New("metrics handler is nil")
		}
		c.metricsHandler = h
		return nil
	}
}

// WithTraceHandler serves h on POST /debug/trace, behind the same keys as
// /metrics (with API keys, an admin key): a server's on-demand device
// trace of its engine's next steps, as vLLM's and SGLang's /start_profile
// (examples/server wires it to pyproc.Engine.Trace). Without it
// /debug/trace answers 404.
func WithTraceHandler(h http.Handler) Option {
	return func(c *config) error {
		if h == nil {
			return errors.New("trace handler is nil")
		}
		c.traceHandler = h
		return nil
	}
}

// WithReadyCheck decides GET /ready: nil from check means ready, an error
// is reported with 503 and its message. Use it to hold readiness until
// models are warm. The default is ready when at least one model is loaded.
func WithReadyCheck(check func(context.Context) error) Option {
	return func(c *config) error {
		if check == nil {
			return errors.New("ready check is nil")
		}
		c.ready = check
		return nil
	}
}

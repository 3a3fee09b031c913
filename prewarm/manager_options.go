package prewarm

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/mlxserving/mlxserving/retry"
	"go.opentelemetry.io/otel/metric"
)

// Defaults of a Manager.
const (
	// DefaultKeepAlive is how long an idle model stays loaded, as in Ollama.
	DefaultKeepAlive = 5 * time.Minute
	// DefaultBackoffMin and DefaultBackoffMax bound the wait after a failed
	// load: it starts at the minimum and doubles up to the maximum, as in
	// LocalAI (see WithLoadBackoff).
	DefaultBackoffMin = 10 * time.Second
	DefaultBackoffMax = 5 * time.Minute
	// DefaultRetryAfter is the hint a *BudgetError gives.
	DefaultRetryAfter = 5 * time.Second
)

// ManagerOption configures a Manager. Options with bad values make
// NewManager return an error.
type ManagerOption interface {
	applyManager(*managerConfig) error
}

// managerOption is an option of a Manager alone.
type managerOption func(*managerConfig) error

func (o managerOption) applyManager(c *managerConfig) error { return o(c) }

// LoggerOption sets the logger of a PreWarmer (each model's progress) or
// a Manager (loads, evictions and failures): it is both an [Option] and
// a [ManagerOption].
type LoggerOption struct{ l *slog.Logger }

// WithLogger receives what a PreWarmer or a Manager logs. The default
// discards; nil is refused.
func WithLogger(l *slog.Logger) LoggerOption { return LoggerOption{l} }

func (o LoggerOption) applyPreWarmer(c *config) error {
	if o.l == nil {
		return fmt.Errorf("WithLogger: nil logger")
	}
	c.logger = o.l
	return nil
}

func (o LoggerOption) applyManager(c *managerConfig) error {
	if o.l == nil {
		return fmt.Errorf("WithLogger: nil logger")
	}
	c.logger = o.l
	return nil
}

type managerConfig struct {
	budget        int64
	keepAlive     time.Duration
	loadBackoff   *retry.Policy
	loadTimeout   time.Duration
	retryAfter    time.Duration
	maxWaiting    int
	logger        *slog.Logger
	meterProvider metric.MeterProvider
}

func defaultManagerConfig() managerConfig {
	return managerConfig{
		keepAlive:   DefaultKeepAlive,
		loadBackoff: retry.MustPolicy(retry.WithBackoff(DefaultBackoffMin, DefaultBackoffMax, 2)),
		retryAfter:  DefaultRetryAfter,
		logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// WithBudget bounds the memory of the loaded models, in bytes, as their
// engines report it (weights + KV). Zero, the default, is no bound: models
// are only unloaded when idle.
func WithBudget(bytes int64) ManagerOption {
	return managerOption(func(c *managerConfig) error {
		if bytes < 0 {
			return fmt.Errorf("WithBudget(%d): want 0 (no budget) or more", bytes)
		}
		c.budget = bytes
		return nil
	})
}

// WithKeepAlive sets the keep-alive of models that name none: how long an
// idle model stays loaded. Negative keeps them forever. Default
// [DefaultKeepAlive]; zero is refused (use a Model's or a request's
// keep-alive of 0 to unload one as soon as it is idle).
func WithKeepAlive(d time.Duration) ManagerOption {
	return managerOption(func(c *managerConfig) error {
		if d == 0 {
			return fmt.Errorf("WithKeepAlive(0): want a positive duration, or negative for forever")
		}
		c.keepAlive = d
		return nil
	})
}

// WithLoadBackoff sets the wait after a failed load: p.Backoff(n) after
// the nth failure in a row (p's attempt cap and classifier do not apply:
// a model is tried again whenever it is asked for after the wait). The
// default starts at [DefaultBackoffMin] and doubles up to
// [DefaultBackoffMax]; nil is refused.
func WithLoadBackoff(p *retry.Policy) ManagerOption {
	return managerOption(func(c *managerConfig) error {
		if p == nil {
			return fmt.Errorf("WithLoadBackoff: nil policy")
		}
		c.loadBackoff = p
		return nil
	})
}

// WithLoadTimeout bounds one load; a load that takes longer fails (and
// backs off). Zero, the default, is no bound.
func WithLoadTimeout(d time.Duration) ManagerOption {
	return managerOption(func(c *managerConfig) error {
		if d < 0 {
			return fmt.Errorf("WithLoadTimeout(%v): want 0 (none) or more", d)
		}
		c.loadTimeout = d
		return nil
	})
}

// WithRetryAfter sets the retry hint of a *BudgetError. Default
// [DefaultRetryAfter].
func WithRetryAfter(d time.Duration) ManagerOption {
	return managerOption(func(c *managerConfig) error {
		if d <= 0 {
			return fmt.Errorf("WithRetryAfter(%v): want a positive duration", d)
		}
		c.retryAfter = d
		return nil
	})
}

// WithMeterProvider records the Manager's metrics through mp: loads by
// outcome, evictions by reason, load seconds, models loaded, memory used
// and budget. The default is a no-op provider.
func WithMeterProvider(mp metric.MeterProvider) ManagerOption {
	return managerOption(func(c *managerConfig) error {
		if mp == nil {
			return fmt.Errorf("WithMeterProvider: nil provider")
		}
		c.meterProvider = mp
		return nil
	})
}

// WithMaxWaiting bounds the requests that may wait for one model to load;
// more are refused at once with a *scheduler.QueueFullError (HTTP 429 with
// Retry-After). Zero, the default, is no bound.
func WithMaxWaiting(n int) ManagerOption {
	return managerOption(func(c *managerConfig) error {
		if n < 0 {
			return fmt.Errorf("WithMaxWaiting(%d): want 0 (no bound) or more", n)
		}
		c.maxWaiting = n
		return nil
	})
}

package prewarm

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/mlxserving/mlxserving/retry"
)

// Defaults of a PreWarmer.
const (
	// DefaultModelTimeout bounds loading plus warming one model.
	DefaultModelTimeout = 10 * time.Minute
	// DefaultWarmRetries is how often a warm-up is retried after the
	// engine lost a worker (retry.Retryable).
	DefaultWarmRetries = 2
)

// Option configures a PreWarmer. Options with bad values make New return
// an error.
type Option interface {
	applyPreWarmer(*config) error
}

// option is an Option of a PreWarmer alone.
type option func(*config) error

func (o option) applyPreWarmer(c *config) error { return o(c) }

type config struct {
	concurrency int
	timeout     time.Duration
	warmRetry   *retry.Policy
	policy      Policy
	onChange    func(ModelProgress)
	logger      *slog.Logger
}

func defaultConfig() config {
	return config{
		concurrency: 1,
		timeout:     DefaultModelTimeout,
		warmRetry:   warmPolicy(DefaultWarmRetries),
		policy:      WhenComplete(),
		logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// WithConcurrency sets how many models load and warm at once, taken in
// priority order. Default 1: one after another.
func WithConcurrency(n int) Option {
	return option(func(c *config) error {
		if n < 1 {
			return fmt.Errorf("WithConcurrency(%d): want 1 or more", n)
		}
		c.concurrency = n
		return nil
	})
}

// WithModelTimeout bounds loading plus warming one model; a model that
// takes longer fails. Default [DefaultModelTimeout].
func WithModelTimeout(d time.Duration) Option {
	return option(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("WithModelTimeout(%v): want a positive duration", d)
		}
		c.timeout = d
		return nil
	})
}

// WithWarmRetries sets how often a warm-up that lost its engine worker is
// retried, after retry's default backoff (retry.DefaultInitial growing by
// retry.DefaultMultiplier). Default [DefaultWarmRetries]; 0 never retries.
func WithWarmRetries(n int) Option {
	return option(func(c *config) error {
		if n < 0 {
			return fmt.Errorf("WithWarmRetries(%d): want 0 or more", n)
		}
		c.warmRetry = warmPolicy(n)
		return nil
	})
}

// WithReadiness sets when the PreWarmer counts as ready: [WhenComplete]
// (the default) or [WhileWarming].
func WithReadiness(p Policy) Option {
	return option(func(c *config) error {
		c.policy = p
		return nil
	})
}

// WithOnChange calls f with a model's progress each time its phase
// changes. f runs on the PreWarmer's goroutines, right after the change
// is visible to Status and Ready, and must not block long. Done closes
// only after every call has returned.
func WithOnChange(f func(ModelProgress)) Option {
	return option(func(c *config) error {
		if f == nil {
			return fmt.Errorf("WithOnChange: nil func")
		}
		c.onChange = f
		return nil
	})
}

// warmPolicy retries a warm-up up to n times after retry's default
// backoff.
func warmPolicy(n int) *retry.Policy {
	return retry.MustPolicy(retry.WithMaxAttempts(n + 1))
}

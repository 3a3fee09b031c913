package retry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Policy decides how often and how long to wait before trying again. It is
// immutable once built and safe for concurrent use; each operation keeps
// its own count in a [Tracker].
type Policy struct {
	initial     time.Duration
	max         time.Duration
	multiplier  float64
	jitter      float64
	maxAttempts int
	maxElapsed  time.Duration
	retryable   func(error) bool
}

// Defaults, after SGLang's model gateway (5 attempts, 50 ms growing ×1.5
// to 30 s, jitter 0.2).
const (
	DefaultInitial     = 50 * time.Millisecond
	DefaultMax         = 30 * time.Second
	DefaultMultiplier  = 1.5
	DefaultJitter      = 0.2
	DefaultMaxAttempts = 5
)

// Option configures a Policy. An option given a bad value makes NewPolicy
// return an error.
type Option func(*Policy) error

// NewPolicy returns a policy. Without options it retries up to
// DefaultMaxAttempts attempts in all, waiting DefaultInitial growing by
// DefaultMultiplier up to DefaultMax, each wait randomised by
// ±DefaultJitter, with no bound on the elapsed time, and retries the
// errors Retryable accepts.
func NewPolicy(opts ...Option) (*Policy, error) {
	p := &Policy{
		initial:     DefaultInitial,
		max:         DefaultMax,
		multiplier:  DefaultMultiplier,
		jitter:      DefaultJitter,
		maxAttempts: DefaultMaxAttempts,
		retryable:   Retryable,
	}
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o(p); err != nil {
			return nil, fmt.Errorf("retry: %w", err)
		}
	}
	if p.max < p.initial {
		return nil, fmt.Errorf("retry: maximum wait %v is below the initial wait %v", p.max, p.initial)
	}
	return p, nil
}

// MustPolicy is NewPolicy for options known to be valid (constants); it
// panics on an error.
func MustPolicy(opts ...Option) *Policy {
	p, err := NewPolicy(opts...)
	if err != nil {
		panic(err)
	}
	return p
}

// WithBackoff sets the first wait, the most any wait may be, and the
// factor each wait grows by. initial must be positive and multiplier at
// least 1.
func WithBackoff(initial, max time.Duration, multiplier float64) Option {
	return func(p *Policy) error {
		if initial <= 0 || max <= 0 {
			return fmt.Errorf("backoff waits %v and %v must be positive", initial, max)
		}
		if multiplier < 1 {
			return fmt.Errorf("backoff multiplier %v is below 1", multiplier)
		}
		p.initial, p.max, p.multiplier = initial, max, multiplier
		return nil
	}
}

// WithJitter randomises each wait by ±f of itself, so clients that failed
// together do not retry together. f is in [0, 1); 0 turns jitter off.
func WithJitter(f float64) Option {
	return func(p *Policy) error {
		if f < 0 || f >= 1 {
			return fmt.Errorf("jitter %v is outside [0, 1)", f)
		}
		p.jitter = f
		return nil
	}
}

// WithMaxAttempts caps the attempts of one operation, the first included:
// 1 never retries. 0 removes the cap (bound the operation by
// WithMaxElapsed or its context instead).
func WithMaxAttempts(n int) Option {
	return func(p *Policy) error {
		if n < 0 {
			return fmt.Errorf("max attempts %d is negative", n)
		}
		p.maxAttempts = n
		return nil
	}
}

// WithMaxElapsed stops retrying once the next attempt would start more than
// d after the first. 0 (the default) removes the bound.
func WithMaxElapsed(d time.Duration) Option {
	return func(p *Policy) error {
		if d < 0 {
			return fmt.Errorf("max elapsed %v is negative", d)
		}
		p.maxElapsed = d
		return nil
	}
}

// WithClassifier replaces Retryable as the test of which errors are tried
// again. A classifier that accepts everything suits loops where every
// failure is worth another try (restarting a worker process).
func WithClassifier(fn func(error) bool) Option {
	return func(p *Policy) error {
		if fn == nil {
			return errors.New("classifier is nil")
		}
		p.retryable = fn
		return nil
	}
}

// Backoff returns the nominal wait after n failed attempts, before any
// jitter: the initial wait grown by the multiplier n-1 times, at most the
// maximum wait. It is 0 for n below 1. For callers that keep a failure
// count of their own (a model that failed to load n times).
func (p *Policy) Backoff(n int) time.Duration {
	if n < 1 {
		return 0
	}
	d := float64(p.initial)
	for i := 1; i < n && d < float64(p.max); i++ {
		d *= p.multiplier
	}
	return min(time.Duration(d), p.max)
}

// MaxAttempts returns the cap on attempts; 0 means none.
func (p *Policy) MaxAttempts() int { return p.maxAttempts }

// Tracker counts one operation's attempts under a Policy. It is not safe
// for concurrent use: one operation, one owner.
type Tracker struct {
	p        *Policy
	b        *backoff.ExponentialBackOff
	attempts int
	start    time.Time
}

// Start begins an operation: the returned Tracker's clock starts now.
func (p *Policy) Start() *Tracker {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.Multiplier = p.initial, p.max, p.multiplier
	b.RandomizationFactor = p.jitter
	b.MaxElapsedTime = 0 // elapsed time is checked here, with Retry-After included
	b.Reset()
	return &Tracker{p: p, b: b, start: time.Now()}
}

// Attempts returns the failed attempts recorded with Next.
func (t *Tracker) Attempts() int { return t.attempts }

// Reset starts the count and the clock again, as after a long success.
func (t *Tracker) Reset() {
	t.attempts = 0
	t.start = time.Now()
	t.b.Reset()
}

// Next records a failed attempt and says whether to try again and after
// how long. It refuses when err is not retryable under the policy's
// classifier, when the attempts are used up, or when waiting would pass
// the elapsed-time bound. A Retry-After carried by err (see RetryAfter)
// lengthens the wait when it is longer than the backoff's.
func (t *Tracker) Next(err error) (time.Duration, bool) {
	t.attempts++
	if !t.p.retryable(err) {
		return 0, false
	}
	if t.p.maxAttempts > 0 && t.attempts >= t.p.maxAttempts {
		return 0, false
	}
	d := t.b.NextBackOff()
	if after, ok := RetryAfter(err); ok && after > d {
		d = after
	}
	if t.p.maxElapsed > 0 && time.Since(t.start)+d > t.p.maxElapsed {
		return 0, false
	}
	return d, true
}

// Wait records a failed attempt, as Next, and waits before the next one.
// It returns nil when the operation should be tried again, err when the
// policy refuses another attempt, and ctx.Err() when ctx ends first.
func (t *Tracker) Wait(ctx context.Context, err error) error {
	d, ok := t.Next(err)
	if !ok {
		return err
	}
	return sleep(ctx, d)
}

// ExhaustedError is returned by Do when a retryable error persisted
// through every attempt the policy allows.
type ExhaustedError struct {
	// Attempts is the number of attempts made.
	Attempts int
	// Err is the last attempt's error.
	Err error
}

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("gave up after %d attempts: %v", e.Attempts, e.Err)
}

// Unwrap returns the last attempt's error.
func (e *ExhaustedError) Unwrap() error { return e.Err }

// Retryable reports false: the policy already retried.
func (e *ExhaustedError) Retryable() bool { return false }

// Do calls fn until it succeeds, fails with an error the policy does not
// retry (returned as is), or the policy gives up (an *ExhaustedError
// wrapping the last error). It waits between attempts and returns
// ctx.Err() if ctx ends first.
func (p *Policy) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	t := p.Start()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := fn(ctx)
		if err == nil {
			return nil
		}
		d, ok := t.Next(err)
		if !ok {
			if t.attempts > 1 && p.retryable(err) {
				return &ExhaustedError{Attempts: t.attempts, Err: err}
			}
			return err
		}
		if err := sleep(ctx, d); err != nil {
			return err
		}
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Retryable reports whether the policy's classifier retries err.
func (p *Policy) Retryable(err error) bool { return p.retryable(err) }

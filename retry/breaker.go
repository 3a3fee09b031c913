package retry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/mlxserving/mlxserving/engine"
)

// ErrBreakerOpen is wrapped by the error a Breaker returns while it refuses
// work. It is retryable: another worker or backend may take the request.
var ErrBreakerOpen = errors.New("circuit breaker open")

// State is a breaker's state: the engine contract's type, so that an
// engine whose workers have breakers (engine.WorkerBreakers) reports
// them as they are. Its String method returns "closed", "half-open" or
// "open".
type State = engine.BreakerState

// Breaker states.
const (
	// StateClosed lets every request through and counts failures.
	StateClosed = engine.BreakerClosed
	// StateHalfOpen lets a few probe requests through; their successes
	// close the breaker, a failure opens it again.
	StateHalfOpen = engine.BreakerHalfOpen
	// StateOpen refuses requests until the open timeout passes.
	StateOpen = engine.BreakerOpen
)

func fromGobreaker(s gobreaker.State) State {
	switch s {
	case gobreaker.StateHalfOpen:
		return StateHalfOpen
	case gobreaker.StateOpen:
		return StateOpen
	}
	return StateClosed
}

// OpenError is the refusal of an open (or saturated half-open) breaker.
type OpenError struct {
	// Name is the breaker's name: the worker or backend it guards.
	Name string
	// State is the breaker's state when it refused.
	State State
}

func (e *OpenError) Error() string {
	return fmt.Sprintf("%s: circuit breaker %s", e.Name, e.State)
}

// Unwrap returns ErrBreakerOpen.
func (e *OpenError) Unwrap() error { return ErrBreakerOpen }

// Status is a snapshot of a breaker, for Stats and metrics: the engine
// contract's type, like State.
type Status = engine.BreakerStatus

// Breaker is a circuit breaker guarding one worker or backend, built on
// gobreaker's two-step breaker: Allow admits a request and returns the
// function that reports its outcome when it is known (for a stream, at
// its end). It is safe for concurrent use.
type Breaker struct {
	cb *gobreaker.TwoStepCircuitBreaker[struct{}]
}

// BreakerOption configures a Breaker.
type BreakerOption func(*breakerConfig) error

type breakerConfig struct {
	consecutive int
	minRequests int
	ratio       float64
	window      time.Duration
	openFor     time.Duration
	probes      int
	onChange    func(name string, from, to State)
	isFailure   func(error) bool
}

// Breaker defaults: open after 5 consecutive failures, or when at least
// half of 10 or more requests in a 60 s window failed; stay open 10 s;
// close after 3 successful probes.
const (
	DefaultTripConsecutive = 5
	DefaultTripMinRequests = 10
	DefaultTripRatio       = 0.5
	DefaultWindow          = 60 * time.Second
	DefaultOpenTimeout     = 10 * time.Second
	DefaultProbes          = 3
)

// WithTrip sets when a closed breaker opens: after consecutive failures in
// a row, or when at least minRequests requests were counted in the window
// and the failed fraction reached ratio. consecutive 0 turns the first
// test off; minRequests 0 turns the second off; not both.
func WithTrip(consecutive, minRequests int, ratio float64) BreakerOption {
	return func(c *breakerConfig) error {
		if consecutive < 0 || minRequests < 0 || (consecutive == 0 && minRequests == 0) {
			return fmt.Errorf("trip thresholds %d consecutive, %d requests: want one positive, none negative", consecutive, minRequests)
		}
		if minRequests > 0 && (ratio <= 0 || ratio > 1) {
			return fmt.Errorf("trip ratio %v is outside (0, 1]", ratio)
		}
		c.consecutive, c.minRequests, c.ratio = consecutive, minRequests, ratio
		return nil
	}
}

// WithWindow sets how long a closed breaker's counts cover before they are
// cleared. 0 never clears them.
func WithWindow(d time.Duration) BreakerOption {
	return func(c *breakerConfig) error {
		if d < 0 {
			return fmt.Errorf("window %v is negative", d)
		}
		c.window = d
		return nil
	}
}

// WithOpenTimeout sets how long an open breaker refuses before it lets
// probes through. Must be positive.
func WithOpenTimeout(d time.Duration) BreakerOption {
	return func(c *breakerConfig) error {
		if d <= 0 {
			return fmt.Errorf("open timeout %v must be positive", d)
		}
		c.openFor = d
		return nil
	}
}

// WithProbes sets how many requests a half-open breaker lets through at
// once; that many successes close it. Must be at least 1.
func WithProbes(n int) BreakerOption {
	return func(c *breakerConfig) error {
		if n < 1 {
			return fmt.Errorf("probes %d: want at least 1", n)
		}
		c.probes = n
		return nil
	}
}

// OnStateChange calls fn on every transition. fn runs with the breaker's
// lock held: it must return quickly and not call the breaker.
func OnStateChange(fn func(name string, from, to State)) BreakerOption {
	return func(c *breakerConfig) error {
		c.onChange = fn
		return nil
	}
}

// WithFailure replaces the test of which outcomes count as the backend's
// failure (see CountsAsFailure, the default).
func WithFailure(fn func(error) bool) BreakerOption {
	return func(c *breakerConfig) error {
		if fn == nil {
			return errors.New("failure test is nil")
		}
		c.isFailure = fn
		return nil
	}
}

// CountsAsFailure is the default test of an outcome:
// Classify(err).CountsAsFailure(). The backend failed (a lost worker, a
// refused or reset connection, a 5xx, a stall, a closed backend) rather
// than the request (bad input) or the caller (cancellation), which count
// as successes of the backend.
func CountsAsFailure(err error) bool { return Classify(err).CountsAsFailure() }

// NewBreaker returns a closed breaker named name (the worker or backend it
// guards, used in errors, Status and metrics).
func NewBreaker(name string, opts ...BreakerOption) (*Breaker, error) {
	c := breakerConfig{
		consecutive: DefaultTripConsecutive,
		minRequests: DefaultTripMinRequests,
		ratio:       DefaultTripRatio,
		window:      DefaultWindow,
		openFor:     DefaultOpenTimeout,
		probes:      DefaultProbes,
		isFailure:   CountsAsFailure,
	}
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o(&c); err != nil {
			return nil, fmt.Errorf("retry: breaker %q: %w", name, err)
		}
	}
	st := gobreaker.Settings{
		Name:        name,
		MaxRequests: uint32(c.probes),
		Interval:    c.window,
		Timeout:     c.openFor,
		ReadyToTrip: func(n gobreaker.Counts) bool {
			if c.consecutive > 0 && n.ConsecutiveFailures >= uint32(c.consecutive) {
				return true
			}
			return c.minRequests > 0 && n.Requests >= uint32(c.minRequests) &&
				float64(n.TotalFailures) >= c.ratio*float64(n.Requests)
		},
		IsSuccessful: func(err error) bool { return !c.isFailure(err) },
		IsExcluded:   func(err error) bool { return errors.Is(err, context.Canceled) },
	}
	if c.onChange != nil {
		st.OnStateChange = func(name string, from, to gobreaker.State) {
			c.onChange(name, fromGobreaker(from), fromGobreaker(to))
		}
	}
	return &Breaker{cb: gobreaker.NewTwoStepCircuitBreaker[struct{}](st)}, nil
}

// Allow admits a request, returning the function that reports its outcome
// (nil for success, the error otherwise). done must be called exactly once.
// While the breaker refuses, Allow returns an *OpenError.
func (b *Breaker) Allow() (done func(err error), err error) {
	done, err = b.cb.Allow()
	if err != nil {
		return nil, &OpenError{Name: b.cb.Name(), State: b.State()}
	}
	return done, nil
}

// Do runs fn if the breaker admits it and records its outcome.
func (b *Breaker) Do(fn func() error) error {
	done, err := b.Allow()
	if err != nil {
		return err
	}
	err = fn()
	done(err)
	return err
}

// Name returns the breaker's name.
func (b *Breaker) Name() string { return b.cb.Name() }

// State returns the current state.
func (b *Breaker) State() State { return fromGobreaker(b.cb.State()) }

// Status returns a snapshot.
func (b *Breaker) Status() Status {
	n := b.cb.Counts()
	return Status{Name: b.cb.Name(), State: b.State(), Requests: n.Requests,
		Failures: n.TotalFailures, ConsecutiveFailures: n.ConsecutiveFailures}
}

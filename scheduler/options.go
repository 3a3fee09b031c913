package scheduler

import (
	"math"
	"time"

	"github.com/mlxserving/mlxserving/api"
)

// Defaults for [New]; each option's doc says how to change it.
const (
	// DefaultMaxQueued is the default request bound.
	DefaultMaxQueued = 10000
	// DefaultAging is how long waiting raises an entry one tier.
	DefaultAging = 5 * time.Second
	// DefaultPromotion is the fraction of its SLA an entry has left when
	// it moves ahead of its tier.
	DefaultPromotion = 0.5
	// DefaultHeadroom is the share of the bounds kept free for more
	// urgent tiers; see [WithHeadroom].
	DefaultHeadroom = 0.2
	// DefaultRateLimitClients is how many clients' buckets are kept.
	DefaultRateLimitClients = 10000
	// MinRetryAfter and MaxRetryAfter clamp the RetryAfter of a
	// *QueueFullError.
	MinRetryAfter = time.Second
	MaxRetryAfter = time.Minute
	// MaxDuration bounds SLAs and the aging interval, so deadline
	// arithmetic can never overflow.
	MaxDuration = 30 * 24 * time.Hour
)

// DefaultSLA returns the default queue-wait SLA of a tier: critical
// 100 ms, high 500 ms, normal 2 s, low 10 s, background none (0).
func DefaultSLA(t api.Tier) time.Duration {
	switch t {
	case api.Critical:
		return 100 * time.Millisecond
	case api.High:
		return 500 * time.Millisecond
	case api.Normal:
		return 2 * time.Second
	case api.Low:
		return 10 * time.Second
	}
	return 0
}

// config is what the options set; New fills defaults first.
type config struct {
	sla        [api.NumTiers]time.Duration
	maxQueued  int
	maxTokens  int
	headroom   float64
	aging      time.Duration
	promotion  float64
	rate       float64 // requests per second per client; 0 = off
	burst      int
	clients    int
	preemption bool
	clock      func() time.Time
}

func defaultConfig() config {
	c := config{
		maxQueued: DefaultMaxQueued,
		aging:     DefaultAging,
		promotion: DefaultPromotion,
		headroom:  DefaultHeadroom,
		clients:   DefaultRateLimitClients,
		clock:     time.Now,
	}
	for r := range api.NumTiers {
		c.sla[r] = DefaultSLA(api.TierOfRank(r))
	}
	return c
}

// Option configures a [PriorityScheduler]; [New] returns an error wrapping
// ErrInvalidOption for an out-of-range value.
type Option func(*config) error

// WithSLA sets tier's queue-wait SLA: Push sets an entry's Deadline to its
// enqueue time plus d, and promotion (see [WithPromotion]) moves it ahead
// of its tier as the deadline nears. d = 0 gives the tier no SLA; d must be in [0,
// MaxDuration].
func WithSLA(tier api.Tier, d time.Duration) Option {
	return func(c *config) error {
		if !tier.Valid() {
			return invalidOption("WithSLA: %v", &api.UnknownTierError{Value: tier.String()})
		}
		if d < 0 || d > MaxDuration {
			return invalidOption("WithSLA(%v, %s): must be in [0, %s]", tier, d, MaxDuration)
		}
		c.sla[tier.Rank()] = d
		return nil
	}
}

// WithMaxQueued bounds the queue to n requests (default
// [DefaultMaxQueued]); 0 leaves it unbounded, n < 0 is refused. Push
// beyond the bound returns a *QueueFullError whose RetryAfter is the time
// the queued tokens take to drain at the observed drain rate (tokens
// popped per second, smoothed), clamped to [MinRetryAfter,
// MaxRetryAfter]; before any drain was observed it is MaxRetryAfter.
// Tiers below critical meet a lower bound; see [WithHeadroom].
func WithMaxQueued(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return invalidOption("WithMaxQueued(%d): must not be negative", n)
		}
		c.maxQueued = n
		return nil
	}
}

// WithMaxQueuedTokens bounds the sum of queued entries' Cost to n (default
// 0: unbounded); n < 0 is refused. An entry costlier than n alone is
// still accepted into an empty queue, so a bound never refuses a request
// forever (CheckFits refuses those that can never run).
func WithMaxQueuedTokens(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return invalidOption("WithMaxQueuedTokens(%d): must not be negative", n)
		}
		c.maxTokens = n
		return nil
	}
}

// WithHeadroom keeps part of the queue's bounds for more urgent tiers, so
// a backlog of less urgent work is refused before it can crowd out a
// critical request: critical entries may fill the bounds, and each tier
// below stops frac/4 of the bounds earlier — with the default
// [DefaultHeadroom] of 0.2, high at 95%, normal at 90%, low at 85% and
// background at 80%. frac = 0 lets every tier fill the whole queue; frac
// must be in [0, 1).
func WithHeadroom(frac float64) Option {
	return func(c *config) error {
		if !(frac >= 0 && frac < 1) {
			return invalidOption("WithHeadroom(%g): must be in [0, 1)", frac)
		}
		c.headroom = frac
		return nil
	}
}

// tierBound is bound as it applies to tier rank r (0 stays unbounded).
func (c *config) tierBound(bound, r int) int {
	if bound == 0 {
		return 0
	}
	top := api.Critical.Rank()
	cut := int(float64(bound) * c.headroom * float64(top-r) / float64(top))
	return max(1, bound-cut)
}

// WithAging sets how long waiting raises an entry one tier (default
// [DefaultAging]), so nothing starves: a background entry ranks as low
// after d, normal after 2d and high after 3d. An entry aged into a tier is
// promoted when an arrival of that tier at that moment would be (at High
// without an SLA, after one more interval), and promoted aged entries run
// after the tier's own promoted entries but before its fresh ones. So aged
// work is held back only while work of a higher tier is about to miss its
// own SLA; aging never lifts work into the critical tier, and a stream of
// critical work that fills every slot does hold everything else back.
// d = 0 turns aging off; d must be in [0, MaxDuration].
func WithAging(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 || d > MaxDuration {
			return invalidOption("WithAging(%s): must be in [0, %s]", d, MaxDuration)
		}
		c.aging = d
		return nil
	}
}

// WithPromotion sets the fraction of its SLA an entry has left when it is
// promoted (default [DefaultPromotion]): it then runs before every
// unpromoted entry of its effective tier, earliest deadline first, instead
// of shortest job first, so a large job cannot miss its deadline behind a
// stream of small ones. Promotion never lifts an entry above a more urgent
// tier. frac = 0 turns promotion off; frac must be in [0, 1).
func WithPromotion(frac float64) Option {
	return func(c *config) error {
		if !(frac >= 0 && frac < 1) {
			return invalidOption("WithPromotion(%g): must be in [0, 1)", frac)
		}
		c.promotion = frac
		return nil
	}
}

// WithRateLimit limits every client (Entry.Client other than "") to
// perSecond requests per second with bursts of burst, as a token bucket.
// Buckets of the most recently seen [DefaultRateLimitClients] clients are
// kept (see [WithRateLimitClients]); a client evicted from that table
// starts again with a full bucket. perSecond = 0 turns limits off (the
// default); otherwise perSecond must be positive and finite and burst at
// least 1.
func WithRateLimit(perSecond float64, burst int) Option {
	return func(c *config) error {
		if perSecond == 0 {
			c.rate, c.burst = 0, 0
			return nil
		}
		if !(perSecond > 0) || math.IsInf(perSecond, 1) || burst < 1 {
			return invalidOption("WithRateLimit(%g, %d): want a positive finite rate and a burst of at least 1", perSecond, burst)
		}
		c.rate, c.burst = perSecond, burst
		return nil
	}
}

// WithRateLimitClients sets how many clients' buckets are remembered
// (default [DefaultRateLimitClients]); n must be at least 1.
func WithRateLimitClients(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return invalidOption("WithRateLimitClients(%d): must be at least 1", n)
		}
		c.clients = n
		return nil
	}
}

// WithPreemption lets a waiting critical entry that cannot be admitted
// evict running work of lower tiers (see [PriorityScheduler.Preempts]).
// Off by default.
func WithPreemption(on bool) Option {
	return func(c *config) error {
		c.preemption = on
		return nil
	}
}

// WithClock replaces time.Now, for deterministic tests and simulations.
// nil is refused.
func WithClock(now func() time.Time) Option {
	return func(c *config) error {
		if now == nil {
			return invalidOption("WithClock(nil)")
		}
		c.clock = now
		return nil
	}
}

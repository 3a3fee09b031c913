package scheduler

import (
	"math"
	"time"

	"github.com/mlxserving/mlxserving/internal/lru"
)

// limiter keeps a token bucket per client in a bounded LRU table, so a
// flood of distinct client ids costs at most the table's size in memory.
// A nil limiter allows everything. It is not safe for concurrent use; the
// scheduler's lock guards it.
type limiter struct {
	rate    float64                   // tokens added per second
	burst   float64                   // bucket size
	buckets *lru.LRU[string, *bucket] // each of weight 1; no TTL
}

// bucket is one client's tokens as of last.
type bucket struct {
	tokens float64
	last   time.Time
}

// newLimiter keeps the buckets of the clients most recently seen;
// clients is at least 1 (WithRateLimitClients checks it).
func newLimiter(rate float64, burst, clients int) *limiter {
	return &limiter{rate: rate, burst: float64(burst), buckets: lru.New[string, *bucket](int64(clients), 0, nil)}
}

// take spends one of client's tokens, or returns a *RateLimitError saying
// when the bucket next holds a whole token.
func (l *limiter) take(client string, now time.Time) error {
	if l == nil || client == "" {
		return nil
	}
	b, ok := l.buckets.Get(client)
	if !ok {
		b = &bucket{tokens: l.burst, last: now}
		l.buckets.Add(client, b, 1)
	} else if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = math.Min(l.burst, b.tokens+elapsed.Seconds()*l.rate)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return nil
	}
	wait := time.Duration(math.Ceil((1 - b.tokens) / l.rate * float64(time.Second)))
	return &RateLimitError{Client: client, Rate: l.rate, Burst: int(l.burst), RetryAfter: wait}
}

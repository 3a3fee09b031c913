package scheduler

import (
	"time"

	"github.com/mlxserving/mlxserving/internal/lru"
	"github.com/mlxserving/mlxserving/internal/tokenbucket"
)

// limiter keeps a token bucket per client in a bounded LRU table, so a
// flood of distinct client ids costs at most the table's size in memory.
// A nil limiter allows everything. It is not safe for concurrent use; the
// scheduler's lock guards it.
type limiter struct {
	rate    float64                               // tokens added per second
	burst   int                                   // bucket size
	buckets *lru.LRU[string, *tokenbucket.Bucket] // each of weight 1; no TTL
}

// newLimiter keeps the buckets of the clients most recently seen;
// clients is at least 1 (WithRateLimitClients checks it).
func newLimiter(rate float64, burst, clients int) *limiter {
	return &limiter{rate: rate, burst: burst, buckets: lru.New[string, *tokenbucket.Bucket](int64(clients), 0, nil)}
}

// take spends one of client's tokens, or returns a *RateLimitError saying
// when the bucket next holds a whole token.
func (l *limiter) take(client string, now time.Time) error {
	if l == nil || client == "" {
		return nil
	}
	b, ok := l.buckets.Get(client)
	if !ok {
		b = tokenbucket.New(l.rate, float64(l.burst)) // a new client starts with a full bucket
		l.buckets.Add(client, b, 1)
	}
	if wait := b.Take(now, 1); wait > 0 {
		return &RateLimitError{Client: client, Rate: l.rate, Burst: l.burst, RetryAfter: wait}
	}
	return nil
}

// Package tokenbucket is the token bucket behind the serving stack's rate
// limits: the scheduler's per-client request rate and the HTTP API's
// per-key requests and tokens per minute.
//
// A Bucket holds up to its size and refills continuously at its rate. It
// takes the time as an argument (tests step it) and says how long until
// it holds a level, which is what a refusal's Retry-After tells the
// client. Charge spends past empty: a request that used more tokens than
// the bucket holds leaves it in debt, and the client waits the debt off.
//
//	b := tokenbucket.New(2, 3) // 2 per second, bursts of 3
//	if wait := b.Take(time.Now(), 1); wait > 0 {
//		return &RateLimitError{RetryAfter: wait}
//	}
//
// It is not golang.org/x/time/rate because that refuses to spend more
// than the burst at once, and the tokens of a finished request are
// spent whatever their number.
package tokenbucket

import (
	"math"
	"time"
)

// Bucket is a token bucket. Build one with New. A nil *Bucket is no
// limit: it takes everything at once. It is not safe for concurrent use;
// its owners hold a lock of their own around it (the scheduler's, a key's
// grant), as they do around an internal/lru LRU.
type Bucket struct {
	rate  float64 // per second
	size  float64
	level float64
	last  time.Time // of the last refill; zero before the first
}

// New returns a full bucket of size that refills at rate per second.
// rate and size must be positive (the callers' options check them).
func New(rate, size float64) *Bucket {
	return &Bucket{rate: rate, size: size, level: size}
}

// Take spends n if the bucket holds n at now and returns 0; otherwise it
// spends nothing and returns how long until the bucket holds n.
func (b *Bucket) Take(now time.Time, n float64) time.Duration {
	if b == nil {
		return 0
	}
	b.refill(now)
	if b.level >= n {
		b.level -= n
		return 0
	}
	return b.until(n)
}

// Until returns 0 if the bucket holds more than level at now, else how
// long until it does. It spends nothing.
func (b *Bucket) Until(now time.Time, level float64) time.Duration {
	if b == nil {
		return 0
	}
	b.refill(now)
	if b.level > level {
		return 0
	}
	return b.until(math.Nextafter(level, math.Inf(1)))
}

// Charge spends n at now; the level may go below zero.
func (b *Bucket) Charge(now time.Time, n float64) {
	if b == nil {
		return
	}
	b.refill(now)
	b.level -= n
}

// refill adds what the time since the last refill brings, up to the
// size; a clock that went back adds nothing.
func (b *Bucket) refill(now time.Time) {
	if !b.last.IsZero() {
		if d := now.Sub(b.last); d > 0 {
			b.level = math.Min(b.size, b.level+d.Seconds()*b.rate)
		}
	}
	if now.After(b.last) {
		b.last = now
	}
}

// until is how long until the level reaches level, rounded up to the
// nanosecond (at least 1ns).
func (b *Bucket) until(level float64) time.Duration {
	d := time.Duration(math.Ceil((level - b.level) / b.rate * float64(time.Second)))
	return max(d, 1)
}

package scheduler

import (
	"slices"
	"time"

	"github.com/mlxserving/mlxserving/api"
)

// waitSamples is how many recent queue waits each tier keeps for its
// percentiles.
const waitSamples = 1024

// Stats is a snapshot of the queue.
type Stats struct {
	// Tiers has one row per tier, most urgent first (as Tiers returns).
	Tiers []TierStats
	// Queued and QueuedTokens are what the queue holds now.
	Queued, QueuedTokens int
	// Pushed, Popped, Requeued and Removed count calls that moved an
	// entry in or out.
	Pushed, Popped, Requeued, Removed uint64
	// Rejected counts pushes refused by the bounds; RateLimited those
	// refused by a client's rate limit.
	Rejected, RateLimited uint64
	// DrainRate is the smoothed rate at which queued tokens were popped,
	// per second, while work was waiting; 0 before any was observed.
	DrainRate float64
}

// Tier returns the row of tier t (zero for an invalid tier).
func (s Stats) Tier(t api.Tier) TierStats {
	for _, row := range s.Tiers {
		if row.Tier == t {
			return row
		}
	}
	return TierStats{}
}

// TierStats describes one tier.
type TierStats struct {
	// Tier is the tier this row describes.
	Tier api.Tier
	// Queued is how many entries of this tier wait now.
	Queued int
	// Waits is how many queue waits the percentiles cover: the most
	// recent first pops of this tier, at most 1024.
	Waits int
	// WaitP50 and WaitP99 are percentiles of the time from Push to first
	// Pop (a requeued entry's second wait is not counted).
	WaitP50, WaitP99 time.Duration
	// Rejected and RateLimited count this tier's refused pushes.
	Rejected, RateLimited uint64
}

// counters is the bookkeeping behind Stats; the scheduler's lock guards
// it.
type counters struct {
	queued                            [api.NumTiers]int
	rejected, rateLimited             [api.NumTiers]uint64
	pushed, popped, requeued, removed uint64
	waits                             [api.NumTiers][]time.Duration // ring buffers
	waitNext                          [api.NumTiers]int
}

func newCounters() counters {
	var c counters
	for r := range c.waits {
		c.waits[r] = make([]time.Duration, 0, waitSamples)
	}
	return c
}

// recordWait adds one queue wait of tier rank r to its ring buffer.
func (c *counters) recordWait(r int, d time.Duration) {
	if len(c.waits[r]) < waitSamples {
		c.waits[r] = append(c.waits[r], d)
		return
	}
	c.waits[r][c.waitNext[r]] = d
	c.waitNext[r] = (c.waitNext[r] + 1) % waitSamples
}

// Stats returns a snapshot of the queue and its recent waits.
func (s *PriorityScheduler[T]) Stats() Stats {
	s.mu.Lock()
	out := Stats{
		Queued: s.count, QueuedTokens: s.tokens,
		Pushed: s.stats.pushed, Popped: s.stats.popped,
		Requeued: s.stats.requeued, Removed: s.stats.removed,
		DrainRate: s.drain.rate,
	}
	var waits [api.NumTiers][]time.Duration
	for _, t := range api.Tiers() {
		r := t.Rank()
		waits[r] = slices.Clone(s.stats.waits[r])
		out.Tiers = append(out.Tiers, TierStats{
			Tier: t, Queued: s.stats.queued[r],
			Rejected: s.stats.rejected[r], RateLimited: s.stats.rateLimited[r],
		})
		out.Rejected += s.stats.rejected[r]
		out.RateLimited += s.stats.rateLimited[r]
	}
	s.mu.Unlock()
	for i := range out.Tiers { // sort outside the lock
		w := waits[out.Tiers[i].Tier.Rank()]
		slices.Sort(w)
		out.Tiers[i].Waits = len(w)
		out.Tiers[i].WaitP50 = percentile(w, 0.50)
		out.Tiers[i].WaitP99 = percentile(w, 0.99)
	}
	return out
}

// percentile returns the q-quantile of sorted (nearest rank), 0 if empty.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// drainMeter estimates how fast the queue drains, in tokens per second,
// as an exponential moving average over windows of at least drainWindow
// during which work was queued.
type drainMeter struct {
	start  time.Time // start of the current window; zero before any
	tokens int       // tokens popped in the current window
	rate   float64   // smoothed rate; valid when seen
	seen   bool
}

const (
	drainWindow = 250 * time.Millisecond
	drainAlpha  = 0.3 // weight of the newest window
)

// idle restarts the window: the queue was empty until now, so the time
// since says nothing about how fast it drains.
func (m *drainMeter) idle(now time.Time) { m.start, m.tokens = now, 0 }

// add records tokens popped at now.
func (m *drainMeter) add(tokens int, now time.Time) {
	m.roll(now)
	m.tokens += tokens
}

// roll closes the current window if it is long enough.
func (m *drainMeter) roll(now time.Time) {
	if m.start.IsZero() {
		m.start = now
		return
	}
	elapsed := now.Sub(m.start)
	if elapsed < drainWindow {
		return
	}
	r := float64(m.tokens) / elapsed.Seconds()
	if m.seen {
		r = drainAlpha*r + (1-drainAlpha)*m.rate
	}
	m.rate, m.seen = r, true
	m.start, m.tokens = now, 0
}

// retryAfter estimates how long queued tokens take to drain, clamped to
// [MinRetryAfter, MaxRetryAfter]; MaxRetryAfter when no drain was seen.
func (m *drainMeter) retryAfter(queued int, now time.Time) time.Duration {
	m.roll(now)
	rate := m.rate
	if !m.seen {
		if el := now.Sub(m.start); el > 0 && m.tokens > 0 {
			rate = float64(m.tokens) / el.Seconds() // first, partial window
		}
	}
	if rate <= 0 {
		return MaxRetryAfter
	}
	secs := float64(queued) / rate
	if secs >= MaxRetryAfter.Seconds() {
		return MaxRetryAfter
	}
	return max(MinRetryAfter, time.Duration(secs*float64(time.Second)).Round(time.Millisecond))
}

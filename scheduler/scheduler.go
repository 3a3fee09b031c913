package scheduler

import (
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/api"
)

// Entry is one queued unit of work. The caller fills Value, Tier, Client
// and Cost; Push fills Enqueued and Deadline. An entry belongs to one
// scheduler at a time, and its exported fields must not change while it
// is queued.
type Entry[T any] struct {
	// Value is the caller's work item, handed to Pop's admit callback.
	Value T
	// Tier is the priority class; the zero value is Normal.
	Tier api.Tier
	// Client is the rate-limit key; "" is not rate limited.
	Client string
	// Cost estimates the tokens of work (prompt + max new tokens): the
	// shortest-job-first key, and what counts against the queued-token
	// bound. It must be at least 1.
	Cost int
	// Urgent runs the entry ahead of the rest of its tier, as if its SLA
	// were about to be missed (the promoted band, earliest enqueued
	// first): work whose caller is already waiting mid-stream, such as a
	// generation resumed here after another server lost it.
	Urgent bool
	// Enqueued is set by Push and kept across Requeue.
	Enqueued time.Time
	// Deadline is Enqueued plus the tier's SLA, set by Push; zero when the
	// tier has none.
	Deadline time.Time

	owner      *PriorityScheduler[T]
	queued     bool
	popped     bool // popped at least once: its queue wait was recorded
	rank       int8 // the tier's rank when queued
	band       int8
	cost       int // Cost when queued
	bandPos    int
	movePos    int
	seq        uint64
	promotedAt time.Time
	next       time.Time
}

// PriorityScheduler is the admission queue in front of a batcher: tiers
// with SLA deadlines, shortest job first inside a tier, promotion near the
// deadline, aging, bounds that reject at once, per-client rate limits and
// the preemption rule. All methods are safe for concurrent use.
type PriorityScheduler[T any] struct {
	cfg    config
	ready  chan struct{}
	bounds [api.NumTiers][2]int // per tier rank: request and token bound

	mu      sync.Mutex
	closed  bool
	bands   [numBands]entryHeap[T]
	moves   entryHeap[T] // entries that change band later, by time
	count   int
	tokens  int
	seq     uint64
	limiter *limiter
	drain   drainMeter
	stats   counters
}

// New returns an empty scheduler. Without options: default SLAs (see
// [DefaultSLA]), at most [DefaultMaxQueued] requests and no token bound,
// aging every [DefaultAging], promotion at [DefaultPromotion] of the SLA
// left, 20% of the bounds kept for more urgent tiers (see [WithHeadroom]),
// no rate limits, no preemption. An invalid option makes New return
// an error wrapping ErrInvalidOption.
func New[T any](opts ...Option) (*PriorityScheduler[T], error) {
	cfg := defaultConfig()
	for _, opt := range opts {
		if opt == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := opt(&cfg); err != nil {
			return nil, err
		}
	}
	s := &PriorityScheduler[T]{
		cfg:   cfg,
		ready: make(chan struct{}, 1),
		bands: newBands[T](),
		moves: entryHeap[T]{less: lessByNext[T], pos: func(e *Entry[T]) *int { return &e.movePos }},
		stats: newCounters(),
	}
	for r := range api.NumTiers {
		s.bounds[r] = [2]int{cfg.tierBound(cfg.maxQueued, r), cfg.tierBound(cfg.maxTokens, r)}
	}
	if cfg.rate > 0 {
		s.limiter = newLimiter(cfg.rate, cfg.burst, cfg.clients)
	}
	return s, nil
}

// Push queues e, or refuses it at once: *UnknownTierError for an invalid
// Tier, an error wrapping ErrInvalidEntry for a nil entry, Cost below 1 or
// an entry already queued, ErrClosed after Close, *QueueFullError when a
// bound is reached and *RateLimitError when e.Client is over its rate.
// Refusals cost O(1) and consume nothing; an accepted push costs
// O(log n).
func (s *PriorityScheduler[T]) Push(e *Entry[T]) error {
	if e == nil {
		return invalidEntry("nil entry")
	}
	r := e.Tier.Rank()
	if r < 0 {
		return &api.UnknownTierError{Value: e.Tier.String()}
	}
	if e.Cost < 1 {
		return invalidEntry("cost %d: must be at least 1", e.Cost)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if e.queued {
		return invalidEntry("entry is already queued")
	}
	now := s.cfg.clock()
	if err := s.checkBounds(r, e.Cost, now); err != nil {
		s.stats.rejected[r]++
		return err
	}
	if err := s.limiter.take(e.Client, now); err != nil {
		s.stats.rateLimited[r]++
		return err
	}
	if s.count == 0 {
		s.drain.idle(now) // time with nothing queued is not drain time
	}
	e.Enqueued, e.Deadline = now, time.Time{}
	if sla := s.cfg.sla[r]; sla > 0 {
		e.Deadline = now.Add(sla)
	}
	e.rank, e.popped = int8(r), false
	s.enqueue(e, now)
	s.stats.pushed++
	return nil
}

// checkBounds returns a *QueueFullError when an entry of tier rank r and
// cost does not fit. Has to be called with the lock.
func (s *PriorityScheduler[T]) checkBounds(r, cost int, now time.Time) error {
	maxQueued, maxTokens := s.bounds[r][0], s.bounds[r][1]
	byCount := maxQueued > 0 && s.count >= maxQueued
	byTokens := maxTokens > 0 && s.tokens > 0 && cost > maxTokens-s.tokens
	if !byCount && !byTokens {
		return nil
	}
	return &QueueFullError{
		Tier: api.TierOfRank(r), Queued: s.count, QueuedTokens: s.tokens,
		MaxQueued: maxQueued, MaxQueuedTokens: maxTokens,
		Cost: cost, RetryAfter: s.drain.retryAfter(s.tokens, now),
	}
}

// enqueue adds e to the queue and signals Ready. Has to be called with
// the lock.
func (s *PriorityScheduler[T]) enqueue(e *Entry[T], now time.Time) {
	s.seq++
	e.owner, e.queued, e.seq, e.cost = s, true, s.seq, e.Cost
	e.bandPos, e.movePos = -1, -1
	s.insert(e, now)
	s.count++
	s.tokens += e.cost
	s.stats.queued[e.rank]++
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// dequeue takes a queued e out. Has to be called with the lock.
func (s *PriorityScheduler[T]) dequeue(e *Entry[T]) {
	s.detach(e)
	e.queued = false
	s.count--
	s.tokens -= e.cost
	s.stats.queued[e.rank]--
}

// Pop considers the most urgent entry. Effective tiers run in tier order;
// an entry's effective tier is its own, raised one tier per aging interval
// up to High. Inside an effective tier, first come entries of that tier
// close to their deadline (promoted, see WithPromotion), earliest deadline
// first; then promoted entries that aged into it, oldest promotion first;
// then the rest, shortest job (lowest Cost) first, ties by enqueue time.
// If admit accepts the entry's Value, Pop removes and returns it as next;
// if admit refuses, Pop returns it as blocked and leaves it queued. A nil
// admit accepts. An empty queue returns (nil, nil).
//
// The order is strict: when the most urgent entry does not fit, nothing
// behind it is tried. Letting smaller or lower-tier work fill the room
// would keep a large urgent request waiting for as long as small work
// keeps arriving; refusing instead lets room accumulate for it, and a
// blocked critical entry tells the caller to preempt (see Preempts).
//
// admit is called without the lock held, so it may call the scheduler.
// Pop costs O(log n) plus O(log n) for every entry whose band changed
// since the last Pop.
func (s *PriorityScheduler[T]) Pop(admit func(T) bool) (next, blocked *Entry[T]) {
	for {
		s.mu.Lock()
		now := s.cfg.clock()
		s.advance(now)
		e := s.top()
		s.mu.Unlock()
		if e == nil {
			return nil, nil
		}
		ok := admit == nil || admit(e.Value)
		s.mu.Lock()
		if !e.queued || e.owner != s {
			s.mu.Unlock()
			continue // removed while admit ran: look again
		}
		if !ok {
			s.mu.Unlock()
			return nil, e
		}
		s.dequeue(e)
		s.drain.add(e.cost, now)
		if !e.popped {
			e.popped = true
			s.stats.recordWait(int(e.rank), now.Sub(e.Enqueued))
		}
		s.stats.popped++
		s.mu.Unlock()
		return e, nil
	}
}

// Requeue puts back an entry that was popped and must run again later (a
// preempted sequence that will recompute). It keeps Enqueued and Deadline,
// so the entry resumes its place by age, and it is never refused by the
// bounds, the rate limits or Close (after Close, Drain returns it). A nil
// or already queued entry is ignored. An entry never pushed is stamped as
// Push would, and its Tier is read again if still valid.
func (s *PriorityScheduler[T]) Requeue(e *Entry[T]) {
	if e == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.queued {
		return
	}
	now := s.cfg.clock()
	if r := e.Tier.Rank(); r >= 0 {
		e.rank = int8(r)
	} else if e.owner == nil {
		e.rank = int8(api.Normal.Rank())
	}
	if e.Enqueued.IsZero() {
		e.Enqueued = now
		if sla := s.cfg.sla[e.rank]; sla > 0 {
			e.Deadline = now.Add(sla)
		}
	}
	if e.Cost < 1 {
		e.Cost = 1
	}
	s.enqueue(e, now)
	s.stats.requeued++
}

// Remove takes e out of the queue (its request was cancelled while
// waiting) and reports whether it was queued here; false means it was
// already popped, removed or drained.
func (s *PriorityScheduler[T]) Remove(e *Entry[T]) bool {
	if e == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !e.queued || e.owner != s {
		return false
	}
	s.dequeue(e)
	s.stats.removed++
	return true
}

// Ready receives a value (the channel has room for one; sends never
// block) whenever Push or Requeue adds work, and once on Close, so a
// consumer can sleep until there is something to Pop. It is never closed.
func (s *PriorityScheduler[T]) Ready() <-chan struct{} { return s.ready }

// Preempts reports whether a waiting entry of tier waiting may evict a
// running sequence of tier running: preemption is on (see
// [WithPreemption]), waiting is Critical and running is lower.
func (s *PriorityScheduler[T]) Preempts(waiting, running api.Tier) bool {
	return s.cfg.preemption && waiting == api.Critical && api.Critical.Outranks(running)
}

// Len returns the number of queued entries and the sum of their Cost.
func (s *PriorityScheduler[T]) Len() (requests, tokens int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count, s.tokens
}

// Close makes later Push calls return ErrClosed. Queued entries stay
// queued (Pop still serves them) until Drain. Close is idempotent.
func (s *PriorityScheduler[T]) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// Drain removes and returns every queued entry, most urgent first, so the
// owner can fail them explicitly after Close.
func (s *PriorityScheduler[T]) Drain() []*Entry[T] {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance(s.cfg.clock())
	out := make([]*Entry[T], 0, s.count)
	for e := s.top(); e != nil; e = s.top() {
		s.dequeue(e)
		out = append(out, e)
	}
	return out
}

package merge

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
)

// Outcome says how a request was served.
type Outcome string

// Outcomes.
const (
	// Miss is a fresh generation (which later requests may join).
	Miss Outcome = "miss"
	// Hit is a replay of a cached response.
	Hit Outcome = "hit"
	// Merged is a subscription to an identical generation in flight.
	Merged Outcome = "merged"
)

// ErrClosed ends the streams of generations still in flight when the
// Merger closes, and refuses Join after Close.
var ErrClosed = fmt.Errorf("merge: %w", engine.ErrClosed)

// Start starts the one generation behind a key. ctx is the generation's
// own context, cancelled when its last subscriber leaves or the Merger
// closes; tier is the most urgent tier among its subscribers so far.
type Start func(ctx context.Context, tier api.Tier) (api.Source, error)

// Raiser is implemented by Sources whose priority can be raised while they
// wait: Raise moves the generation to a more urgent tier if it has not
// started running yet.
type Raiser interface {
	Raise(api.Tier)
}

// Merger coalesces identical in-flight requests and keeps a response
// cache. It is safe for concurrent use. Create it with New; Close stops
// every generation it started.
type Merger struct {
	cache     *cache      // nil when off
	shared    SharedCache // nil when off
	sharedTTL time.Duration

	ctx    context.Context // parent of every flight's context
	cancel context.CancelFunc

	mu      sync.Mutex
	flights map[Key]*flight
	closed  bool

	merged                   atomic.Uint64
	misses                   atomic.Uint64
	sharedHits, sharedErrors atomic.Uint64
}

// Option configures New.
type Option func(*config) error

type config struct {
	cacheBytes int64
	cacheTTL   time.Duration
	shared     SharedCache
	sharedTTL  time.Duration
}

// WithCache turns on the response cache: finished responses that opted in
// are kept up to maxBytes in all (their chunks' text and token data) and
// for at most ttl each; the least recently used go first. maxBytes and ttl
// must be positive.
func WithCache(maxBytes int64, ttl time.Duration) Option {
	return func(c *config) error {
		if maxBytes <= 0 || ttl <= 0 {
			return fmt.Errorf("merge: WithCache(%d, %v): want a positive size and TTL", maxBytes, ttl)
		}
		c.cacheBytes, c.cacheTTL = maxBytes, ttl
		return nil
	}
}

// New returns a Merger; without options it coalesces but keeps no cache.
func New(opts ...Option) (*Merger, error) {
	var c config
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	if c.shared != nil && c.cacheBytes == 0 {
		return nil, fmt.Errorf("merge: WithSharedCache needs WithCache for the local tier")
	}
	var cache *cache
	if c.cacheBytes > 0 {
		cache = newCache(c.cacheBytes, c.cacheTTL)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Merger{cache: cache, shared: c.shared, sharedTTL: c.sharedTTL, ctx: ctx, cancel: cancel, flights: make(map[Key]*flight)}, nil
}

// Stats counts what a Merger did.
type Stats struct {
	// Merged counts requests served by joining a generation in flight.
	Merged uint64
	// Misses counts requests that started a generation.
	Misses uint64
	// CacheHits, CacheMisses and CacheEvictions count cache look-ups of
	// requests that opted in, and entries dropped (least recently used
	// or expired).
	CacheHits      uint64
	CacheMisses    uint64
	CacheEvictions uint64
	// CacheBytes and CacheEntries are what the cache holds now.
	CacheBytes   int64
	CacheEntries int
	// InFlight is the number of generations running.
	InFlight int
	// SharedHits counts responses found in the shared cache (WithSharedCache)
	// after a local miss; SharedErrors the shared-cache calls that failed
	// (store unreachable, a value that does not decode).
	SharedHits, SharedErrors uint64
}

// Stats returns the counters. Safe for concurrent use.
func (m *Merger) Stats() Stats {
	m.mu.Lock()
	n := len(m.flights)
	m.mu.Unlock()
	st := Stats{Merged: m.merged.Load(), Misses: m.misses.Load(), InFlight: n,
		SharedHits: m.sharedHits.Load(), SharedErrors: m.sharedErrors.Load()}
	if m.cache != nil {
		m.cache.stats(&st)
	}
	return st
}

// Join serves a request named by k. With useCache, a cached response is
// replayed (Hit). Otherwise the request subscribes to the generation in
// flight under k (Merged), or starts one with start (Miss) that later
// identical requests may join; with useCache it is cached when it
// finishes. An error from start is returned as is. The returned Source
// leaves the generation when ctx ends or it is closed.
func (m *Merger) Join(ctx context.Context, k Key, tier api.Tier, useCache bool, start Start) (api.Source, Outcome, error) {
	if useCache && m.cache != nil {
		if e, ok := m.cache.get(k); ok {
			return newReplay(e), Hit, nil
		}
		if m.shared != nil {
			if e, ok := m.sharedGet(ctx, k); ok {
				return newReplay(e), Hit, nil
			}
		}
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, "", ErrClosed
	}
	if f := m.flights[k]; f != nil {
		if s := f.join(ctx, tier, useCache); s != nil {
			m.mu.Unlock()
			m.merged.Add(1)
			return s, Merged, nil
		}
	}
	// Starting under the lock lets identical requests arriving meanwhile
	// join this generation; start only validates and queues.
	fctx, cancel := context.WithCancel(m.ctx)
	src, err := start(fctx, tier)
	if err != nil {
		m.mu.Unlock()
		cancel()
		return nil, "", err
	}
	f := &flight{m: m, key: k, src: src, ctx: fctx, cancel: cancel, tier: tier, notify: make(chan struct{}),
		chunks: make([]api.Chunk, 0, 16)}
	s := f.join(ctx, tier, useCache)
	m.flights[k] = f
	m.mu.Unlock()
	m.misses.Add(1)
	return s, Miss, nil
}

// forget removes f from the flights if it is still the one under its key.
func (m *Merger) forget(f *flight) {
	m.mu.Lock()
	if m.flights[f.key] == f {
		delete(m.flights, f.key)
	}
	m.mu.Unlock()
}

// Close stops every generation in flight (their subscribers get
// ErrClosed) and empties the cache. Later Joins fail with ErrClosed.
// Idempotent. A Merger starts no goroutine: subscribers read the
// generations, and the cache expires entries as it is used.
func (m *Merger) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	flights := make([]*flight, 0, len(m.flights))
	for _, f := range m.flights {
		flights = append(flights, f)
	}
	m.mu.Unlock()
	m.cancel() // first, so pulls that fail now report ErrClosed
	for _, f := range flights {
		f.stop(ErrClosed)
	}
	if m.cache != nil {
		m.cache.purge()
	}
}

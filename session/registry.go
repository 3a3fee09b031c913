package session

import (
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/mlxserving/mlxserving/internal/lru"
)

// Defaults of a Registry.
const (
	DefaultTTL         = 30 * time.Minute
	DefaultMaxSessions = 10000
)

// Session is one conversation's entry in a Registry.
type Session struct {
	// ID is the session id.
	ID string
	// Model is the model that served the session last.
	Model string
	// Worker is the engine worker holding the session's saved KV, or -1
	// when unknown or the engine has a single store.
	Worker int
	// Instance names the serving instance holding it, "" for this one.
	Instance string
	// Created is when the first request named the session.
	Created time.Time
	// LastUsed is when a request named it last.
	LastUsed time.Time
	// Turns counts the requests that named it.
	Turns int
}

// Reason says why a session left the registry.
type Reason int

const (
	// Expired: unused for longer than the TTL.
	Expired Reason = iota + 1
	// Evicted: the least recently used session, pushed out by the bound on
	// sessions.
	Evicted
	// Removed: Remove was called.
	Removed
)

func (r Reason) String() string {
	switch r {
	case Expired:
		return "expired"
	case Evicted:
		return "evicted"
	case Removed:
		return "removed"
	}
	return "unknown"
}

// Stats counts a registry's sessions and what happened to them.
type Stats struct {
	// Sessions is the number of live sessions.
	Sessions int
	// Created and Resumed count Begin calls that made a new session or
	// found a live one.
	Created, Resumed uint64
	// Expired, Evicted and Removed count sessions that left for each
	// reason; Forgotten counts those dropped by Forget.
	Expired, Evicted, Removed, Forgotten uint64
}

// Option configures a Registry. A bad value makes New return an error.
type Option func(*config) error

type config struct {
	ttl     time.Duration
	max     int
	onEvict func(Session, Reason)
	now     func() time.Time
}

// WithTTL sets how long an unused session lives. Zero turns expiry off.
// Default DefaultTTL.
func WithTTL(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return errors.New("session: TTL must not be negative")
		}
		c.ttl = d
		return nil
	}
}

// WithMaxSessions bounds the live sessions; beyond it the least recently
// used leaves. Default DefaultMaxSessions; must be at least 1.
func WithMaxSessions(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return errors.New("session: max sessions must be at least 1")
		}
		c.max = n
		return nil
	}
}

// WithOnEvict calls fn for every session that leaves by expiry, the bound
// or Remove (not Forget), after the registry's lock is released, so fn may
// call the registry. It is the place to drop the session's saved KV.
func WithOnEvict(fn func(Session, Reason)) Option {
	return func(c *config) error {
		if fn == nil {
			return errors.New("session: nil eviction callback")
		}
		c.onEvict = fn
		return nil
	}
}

// withClock replaces time.Now, for tests.
func withClock(now func() time.Time) Option {
	return func(c *config) error { c.now = now; return nil }
}

// departure is a session that left and why.
type departure struct {
	s      Session
	reason Reason
}

// Registry maps session ids to their affinity. It is safe for concurrent
// use. With a TTL it runs one goroutine that removes expired sessions;
// Close stops it.
//
// The sessions sit in an internal/lru LRU (bounded by count: each of
// weight 1) under the registry's own lock, with expiry done here: a
// session expires after its last use, not after it was added, and the
// registry calls the eviction callback after releasing its lock.
type Registry struct {
	cfg config

	mu      sync.Mutex
	lru     *lru.LRU[string, *Session]
	gone    []departure // sessions that left under mu, for the callback after it
	stats   Stats
	closed  bool
	stop    chan struct{}
	stopped chan struct{}
}

// New returns a registry configured by opts.
func New(opts ...Option) (*Registry, error) {
	cfg := config{ttl: DefaultTTL, max: DefaultMaxSessions, now: time.Now}
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	r := &Registry{cfg: cfg, stop: make(chan struct{}), stopped: make(chan struct{})}
	r.lru = lru.New[string, *Session](int64(cfg.max), 0, r.left)
	if cfg.ttl > 0 {
		go r.sweep(max(cfg.ttl/10, 10*time.Millisecond))
	} else {
		close(r.stopped)
	}
	return r, nil
}

// NewID mints a random session id (a UUID).
func NewID() string { return uuid.NewString() }

// Key is the engine prefix key a session's KV is saved under.
func Key(id string) string { return "session:" + id }

// Begin records a request of session id for model: it validates id,
// mints one when id is empty, creates the session if it is unknown or
// expired (a fresh session, never an error) and marks it used. It returns
// the session as it is now and whether it was created.
func (r *Registry) Begin(id, model string) (Session, bool, error) {
	if id == "" {
		id = NewID()
	} else if err := ValidateID(id); err != nil {
		return Session{}, false, err
	}
	now := r.cfg.now()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return Session{}, false, ErrClosed
	}
	s, ok := r.lru.Get(id)
	if ok && r.expired(s, now) {
		r.remove(id, Expired)
		ok = false
	}
	created := !ok
	if created {
		s = &Session{ID: id, Worker: -1, Created: now}
		r.lru.Add(id, s, 1) // may evict the least recently used: left
		r.stats.Created++
	} else {
		r.stats.Resumed++
	}
	if s.Model != model {
		s.Model, s.Worker = model, -1
	}
	s.LastUsed = now
	s.Turns++
	out := *s
	gone := r.takeGone()
	r.mu.Unlock()
	r.notify(gone)
	return out, created, nil
}

// Get returns the live session id without marking it used.
func (r *Registry) Get(id string) (Session, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.lru.Peek(id)
	if !ok || r.expired(s, r.cfg.now()) {
		return Session{}, false
	}
	return *s, true
}

// SetWorker records the worker that holds session id's KV. Unknown ids
// are ignored.
func (r *Registry) SetWorker(id string, worker int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s, ok := r.lru.Peek(id); ok {
		s.Worker = worker
	}
}

// Remove ends session id and calls the eviction callback, so its KV is
// dropped. It reports whether the session was live.
func (r *Registry) Remove(id string) bool {
	r.mu.Lock()
	ok := r.remove(id, Removed)
	gone := r.takeGone()
	r.mu.Unlock()
	r.notify(gone)
	return ok
}

// Forget ends session id without the eviction callback: for a session
// whose KV is already gone (its worker died, the engine evicted it). The
// next request naming it starts afresh. It reports whether it was live.
func (r *Registry) Forget(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.lru.Remove(id) // no callback: Remove is no eviction
	if ok {
		r.stats.Forgotten++
	}
	return ok
}

// Len returns the number of sessions held, expired ones not yet swept
// included.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lru.Len()
}

// Stats returns the counters.
func (r *Registry) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.stats
	st.Sessions = r.lru.Len()
	return st
}

// Close stops the expiry goroutine and empties the registry without
// calling the eviction callback. Later Begin calls return ErrClosed.
// Close is idempotent.
func (r *Registry) Close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.stop)
		r.lru.Purge() // no callback: closed
		r.gone = nil
	}
	r.mu.Unlock()
	<-r.stopped
}

// expired reports whether s outlived the TTL. Has to be called with r.mu
// held.
func (r *Registry) expired(s *Session, now time.Time) bool {
	return r.cfg.ttl > 0 && now.Sub(s.LastUsed) > r.cfg.ttl
}

// remove takes id out for reason and records it as left. Has to be
// called with r.mu held.
func (r *Registry) remove(id string, reason Reason) bool {
	s, ok := r.lru.Remove(id)
	if ok {
		r.depart(s, reason)
	}
	return ok
}

// left is the LRU's eviction callback: its bound pushed s out (or Close
// purged it: not recorded). It runs inside LRU calls, with r.mu held.
func (r *Registry) left(_ string, s *Session) {
	if !r.closed {
		r.depart(s, Evicted)
	}
}

// depart records that s left for reason: the stats and, for the
// callback, the departure. Has to be called with r.mu held.
func (r *Registry) depart(s *Session, reason Reason) {
	switch reason {
	case Expired:
		r.stats.Expired++
	case Evicted:
		r.stats.Evicted++
	case Removed:
		r.stats.Removed++
	default:
		return
	}
	if r.cfg.onEvict != nil {
		r.gone = append(r.gone, departure{*s, reason})
	}
}

// takeGone returns the sessions that left and clears the list. Has to be
// called with r.mu held.
func (r *Registry) takeGone() []departure {
	if len(r.gone) == 0 {
		return nil
	}
	g := r.gone
	r.gone = nil
	return g
}

// notify calls the eviction callback for sessions that left; without the
// lock.
func (r *Registry) notify(gone []departure) {
	for _, d := range gone {
		r.cfg.onEvict(d.s, d.reason)
	}
}

// sweep removes expired sessions every interval until Close.
func (r *Registry) sweep(interval time.Duration) {
	defer close(r.stopped)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			r.expire()
		}
	}
}

// expire removes the sessions unused for longer than the TTL, oldest
// first; the LRU order is last-use order, so it stops at the first live
// one.
func (r *Registry) expire() {
	now := r.cfg.now()
	r.mu.Lock()
	for {
		id, s, ok := r.lru.Oldest()
		if !ok || !r.expired(s, now) {
			break
		}
		r.remove(id, Expired)
	}
	gone := r.takeGone()
	r.mu.Unlock()
	r.notify(gone)
}

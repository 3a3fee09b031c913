package balancer

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/internal/lru"
)

// Bounds of a balancer's copy of the session homes.
const (
	homesSize    = 1 << 16 // sessions remembered; the least recently routed go first
	homesLookups = 8       // background lookups at once
)

// homes is a balancer's copy of the affinity store's session homes, so a
// request of a known session finds its home without a round trip. An
// entry younger than the refresh interval is used as it is; an older one
// is used while a background lookup refreshes it; only a session the
// balancer has not seen waits for the store, bounded by the timeout and
// outside any lock. The background lookups are owned: close waits for
// them.
type homes struct {
	store   AffinityStore
	refresh time.Duration
	timeout time.Duration
	logger  *slog.Logger
	cacheMu sync.Mutex             // guards cache; no I/O under it
	cache   *lru.LRU[string, home] // each home of weight 1

	ctx      context.Context // cancelled by close
	cancel   context.CancelFunc
	lookups  chan struct{} // a slot per background lookup running
	inFlight sync.Map      // key → struct{}: keys being looked up
	mu       sync.Mutex    // guards closed against wg.Add
	closed   bool
	wg       sync.WaitGroup
}

// home is one session's home as this balancer knows it.
type home struct {
	backend string    // "" when the store names none
	checked time.Time // when the store last said so, or this balancer wrote it
	written time.Time // when this balancer last wrote it; zero: never
}

func newHomes(store AffinityStore, refresh, timeout time.Duration, logger *slog.Logger) *homes {
	cache := lru.New[string, home](homesSize, 0, nil)
	ctx, cancel := context.WithCancel(context.Background())
	return &homes{
		store: store, refresh: refresh, timeout: timeout, logger: logger, cache: cache,
		ctx: ctx, cancel: cancel, lookups: make(chan struct{}, homesLookups),
	}
}

// get returns the backend the store names as key's home ("" for none). An
// error means the store could not be asked and nothing is known.
func (h *homes) get(ctx context.Context, key string) (string, error) {
	if e, ok := h.cached(key); ok {
		if time.Since(e.checked) >= h.refresh {
			h.lookUp(key)
		}
		return e.backend, nil
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	name, err := h.store.Get(ctx, key)
	if err != nil {
		return "", err
	}
	h.learn(key, name, began)
	return name, nil
}

// learn records that the store named backend as key's home at began,
// unless this balancer has heard or written something newer since.
func (h *homes) learn(key, backend string, began time.Time) {
	h.cacheMu.Lock()
	defer h.cacheMu.Unlock()
	e, ok := h.cache.Peek(key)
	if ok && e.checked.After(began) {
		return
	}
	if !ok || e.backend != backend {
		e = home{backend: backend}
	}
	e.checked = began
	h.cache.Add(key, e, 1)
}

// cached returns key's home as this balancer knows it, marking it used.
func (h *homes) cached(key string) (home, bool) {
	h.cacheMu.Lock()
	defer h.cacheMu.Unlock()
	return h.cache.Get(key)
}

// peek returns key's home as this balancer knows it.
func (h *homes) peek(key string) (home, bool) {
	h.cacheMu.Lock()
	defer h.cacheMu.Unlock()
	return h.cache.Peek(key)
}

// remember records e as key's home.
func (h *homes) remember(key string, e home) {
	h.cacheMu.Lock()
	defer h.cacheMu.Unlock()
	h.cache.Add(key, e, 1)
}

// lookUp asks the store for key's home in the background: one lookup per
// key at a time, at most homesLookups at once (a key refused now is looked
// up by a later request).
func (h *homes) lookUp(key string) {
	if _, busy := h.inFlight.LoadOrStore(key, struct{}{}); busy {
		return
	}
	select {
	case h.lookups <- struct{}{}:
	default:
		h.inFlight.Delete(key)
		return
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		<-h.lookups
		h.inFlight.Delete(key)
		return
	}
	h.wg.Add(1)
	h.mu.Unlock()
	go func() {
		defer h.wg.Done()
		defer func() { <-h.lookups; h.inFlight.Delete(key) }()
		began := time.Now()
		ctx, cancel := context.WithTimeout(h.ctx, h.timeout)
		defer cancel()
		name, err := h.store.Get(ctx, key)
		if err != nil {
			h.logger.Debug("affinity store unreachable; keeping the local home", "err", err)
			return
		}
		h.learn(key, name, began)
	}()
}

// set records that a request of key's session went to backend, as d
// decided. A new or moved home is written to the store at once; a request
// at home refreshes the store's entry (and its TTL) at most once per
// refresh interval, and only while this balancer's copy was confirmed
// within the interval, so a stale copy never overwrites a home another
// replica moved. A spilled request leaves the home as it is.
func (h *homes) set(ctx context.Context, key, backend string, d homeDecision, ttl time.Duration) {
	now := time.Now()
	switch d {
	case newHome, moved:
	case atHome:
		e, ok := h.peek(key)
		if !ok || e.backend != backend || now.Sub(e.checked) >= h.refresh ||
			(!e.written.IsZero() && now.Sub(e.written) < h.refresh) {
			return
		}
	default:
		return
	}
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	if err := h.store.Set(ctx, key, backend, ttl); err != nil {
		h.logger.Warn("affinity store unreachable; session not shared", "err", err)
		if d != atHome {
			h.remember(key, home{backend: backend, checked: now}) // routed here locally meanwhile
		}
		return
	}
	h.remember(key, home{backend: backend, checked: now, written: now})
}

// close stops the background lookups and waits for them.
func (h *homes) close() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.cancel()
	h.wg.Wait()
}

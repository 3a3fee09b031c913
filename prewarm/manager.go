package prewarm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/lru"
	"github.com/mlxserving/mlxserving/scheduler"
)

// Host is what a Manager loads models into: the serving layer
// (mlxserving.Server provides one). Its methods are safe for concurrent
// use and never call back into the Manager.
type Host interface {
	// Load loads spec and starts serving it, returning what the engine
	// reports. It honours ctx; on error nothing stays loaded.
	Load(ctx context.Context, spec engine.ModelSpec) (engine.Info, error)
	// Unload stops serving the model and frees it. With idleOnly set it
	// returns ErrBusy, changing nothing, when the model has requests
	// queued or running; otherwise it lets them finish until ctx ends.
	Unload(ctx context.Context, id string, idleOnly bool) error
	// Busy reports whether the model has requests queued or running.
	Busy(id string) bool
}

// State is where a known model stands in a Manager.
type State int

// Model states.
const (
	// StateUnloaded: known, not in memory; the next request loads it.
	StateUnloaded State = iota
	// StateLoading: a load is under way; requests wait for it.
	StateLoading
	// StateLoaded: serving.
	StateLoaded
	// StateUnloading: being evicted or unloaded; requests wait, then load it
	// again.
	StateUnloading
	// StateFailed: the last load failed; requests get its *LoadError until
	// the back-off ends.
	StateFailed
)

var stateNames = [...]string{"unloaded", "loading", "loaded", "unloading", "failed"}

func (s State) String() string {
	if s < 0 || int(s) >= len(stateNames) {
		return fmt.Sprintf("State(%d)", int(s))
	}
	return stateNames[s]
}

// Manager keeps a registry of known models and loads them into a Host on
// demand: concurrent requests for an unloaded model share one load; a
// memory budget is kept by evicting the least recently used idle models;
// idle models unload after their keep-alive; failed loads back off. It is
// safe for concurrent use. Create it with NewManager and Close it.
type Manager struct {
	host    Host
	cfg     managerConfig
	metrics *managerMetrics
	base    context.Context // cancelled by Close: aborts loads, stops the janitor
	stop    context.CancelFunc
	kick    chan struct{} // wakes the janitor
	wg      sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	entries map[string]*entry
	lru     *lru.LRU[string, struct{}] // loaded models, least recently used first
	used    int64                      // bytes of loaded models plus reservations of loads
}

// entry is one known model. Its fields are guarded by Manager.mu.
type entry struct {
	m         Model
	state     State
	info      engine.Info
	bytes     int64 // reported memory while loaded; reservation while loading
	extra     int64 // Reserve's: charged beyond what the engine reports, at every load
	lastBytes int64 // memory reported by the last load: the next estimate
	lastUsed  time.Time
	keepAlive time.Duration // effective keep-alive
	call      *loadCall     // the load under way
	unloaded  chan struct{} // closed when the current unload ends
	err       *LoadError    // the last failed load, while StateFailed
	failures  int
	loads     int
	evictions int
	loadTime  time.Duration
	waiting   int // requests waiting for a load or an unload to end
}

// loadCall is one load shared by every request that waits for it.
type loadCall struct {
	done    chan struct{}
	err     error
	cancel  context.CancelFunc
	aborted bool
}

// NewManager returns a Manager loading into host. It starts one goroutine,
// the idle janitor, which Close stops.
func NewManager(host Host, opts ...ManagerOption) (*Manager, error) {
	if host == nil {
		return nil, errors.New("prewarm: host is nil")
	}
	cfg := defaultManagerConfig()
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o.applyManager(&cfg); err != nil {
			return nil, fmt.Errorf("prewarm: %w", err)
		}
	}
	g := &Manager{host: host, cfg: cfg, kick: make(chan struct{}, 1), entries: map[string]*entry{}, lru: lru.New[string, struct{}](0, 0, nil)}
	var err error
	if g.metrics, err = newManagerMetrics(cfg.meterProvider, g); err != nil {
		return nil, fmt.Errorf("prewarm: metrics: %w", err)
	}
	g.base, g.stop = context.WithCancel(context.Background())
	g.wg.Add(1)
	go g.janitor()
	return g, nil
}

// Register makes m known: a request for it loads it. Registering an id
// again replaces its settings (pin, keep-alive, prompts) and, when the
// model is not loaded, its spec; a new spec for a model whose load failed
// ends its back-off.
func (g *Manager) Register(m Model) error {
	if err := m.validate(); err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return ErrClosed
	}
	e := g.entries[m.ID()]
	if e == nil {
		e = &entry{}
		g.entries[m.ID()] = e
	} else if e.state != StateUnloaded && e.state != StateFailed && e.m.Spec != m.Spec {
		return fmt.Errorf("prewarm: model %q is %s: unload it before changing its spec", m.ID(), e.state)
	}
	if e.state == StateFailed && e.m.Spec != m.Spec {
		// A new spec (a fixed checkpoint) may load at once.
		e.state, e.err, e.failures, e.lastBytes = StateUnloaded, nil, 0, 0
	}
	e.m = m
	e.keepAlive = g.keepAliveOf(m.KeepAlive)
	return nil
}

func (g *Manager) keepAliveOf(d time.Duration) time.Duration {
	if d == 0 {
		return g.cfg.keepAlive
	}
	return d
}

// Forget unloads the model if it is loaded and removes it from the
// registry.
func (g *Manager) Forget(ctx context.Context, id string) error {
	if err := g.Unload(ctx, id); err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if e := g.entries[id]; e != nil && (e.state == StateUnloaded || e.state == StateFailed) {
		delete(g.entries, id)
	}
	return nil
}

// Known reports whether id is registered.
func (g *Manager) Known(id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.entries[id] != nil
}

// Acquire makes sure the model is loaded, waiting (within ctx) for a load
// that is under way or starting one, and marks it used now. keepAlive, if
// not nil, becomes the model's keep-alive until it next unloads: zero
// unloads it as soon as it is idle, negative keeps it loaded; a later
// load starts with the model's own keep-alive again.
//
// Errors: ErrUnknownModel (wrapped) for an unregistered id, the shared
// *LoadError of a failed load (also while its back-off lasts), a
// *BudgetError when nothing can be evicted to make room, ErrAborted when
// an Unload or Close cancelled the load, a *scheduler.QueueFullError when
// more requests than WithMaxWaiting allows already wait for the model,
// ctx.Err(), ErrClosed.
func (g *Manager) Acquire(ctx context.Context, id string, keepAlive *time.Duration) error {
	for {
		g.mu.Lock()
		if g.closed {
			g.mu.Unlock()
			return ErrClosed
		}
		e := g.entries[id]
		if e == nil {
			g.mu.Unlock()
			return fmt.Errorf("%w: %q", ErrUnknownModel, id)
		}
		if keepAlive != nil {
			e.keepAlive = *keepAlive
		}
		var wait <-chan struct{}
		var call *loadCall
		switch e.state {
		case StateLoaded:
			g.touchLocked(id, e)
			g.mu.Unlock()
			return nil
		case StateFailed:
			if time.Now().Before(e.err.RetryAt) {
				err := e.err
				g.mu.Unlock()
				return err
			}
			call = g.startLoadLocked(e)
		case StateUnloaded:
			call = g.startLoadLocked(e)
		case StateLoading:
			call = e.call
		case StateUnloading:
			wait = e.unloaded
		}
		if max := g.cfg.maxWaiting; max > 0 && e.waiting >= max {
			g.mu.Unlock()
			return &scheduler.QueueFullError{Queued: e.waiting, MaxQueued: max, Cost: 1, RetryAfter: g.cfg.retryAfter}
		}
		e.waiting++
		g.mu.Unlock()
		if call != nil {
			wait = call.done
		}
		var err error
		select {
		case <-wait:
			if call != nil {
				err = call.err
			}
		case <-ctx.Done():
			err = ctx.Err()
		}
		g.mu.Lock()
		e.waiting--
		g.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// touchLocked marks a loaded model used now. Has to be called with g.mu held.
func (g *Manager) touchLocked(id string, e *entry) {
	e.lastUsed = time.Now()
	g.lru.Get(id)
}

// Idle tells the Manager that the model's last request ended: its
// keep-alive counts from now. The Host calls it.
func (g *Manager) Idle(id string) {
	g.mu.Lock()
	if e := g.entries[id]; e != nil && e.state == StateLoaded {
		e.lastUsed = time.Now()
	}
	g.mu.Unlock()
	g.wake()
}

func (g *Manager) wake() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// Unload unloads the model now, waiting for its requests to finish until
// ctx ends. A load under way is cancelled (its waiters get ErrAborted) and
// nothing of it stays loaded. The model stays registered. Unloading a
// model that is not loaded does nothing.
func (g *Manager) Unload(ctx context.Context, id string) error {
	for {
		g.mu.Lock()
		e := g.entries[id]
		if e == nil {
			g.mu.Unlock()
			return fmt.Errorf("%w: %q", ErrUnknownModel, id)
		}
		var wait <-chan struct{}
		switch e.state {
		case StateUnloaded, StateFailed:
			g.mu.Unlock()
			return nil
		case StateLoading:
			e.call.aborted = true
			e.call.cancel()
			wait = e.call.done
		case StateUnloading:
			wait = e.unloaded
		case StateLoaded:
			g.beginUnloadLocked(id, e)
			g.mu.Unlock()
			err := g.host.Unload(ctx, id, false)
			g.mu.Lock()
			g.endUnloadLocked(id, e, err)
			g.mu.Unlock()
			return err
		}
		g.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// beginUnloadLocked marks a loaded model as unloading. Has to be called
// with g.mu held.
func (g *Manager) beginUnloadLocked(id string, e *entry) {
	e.state = StateUnloading
	e.unloaded = make(chan struct{})
	g.lru.Remove(id)
}

// endUnloadLocked records an unload's outcome: on ErrBusy the model stays
// loaded. Has to be called with g.mu held.
func (g *Manager) endUnloadLocked(id string, e *entry, err error) {
	defer close(e.unloaded)
	if errors.Is(err, ErrBusy) {
		e.state = StateLoaded
		g.lru.Add(id, struct{}{}, 0)
		return
	}
	g.used -= e.bytes
	e.bytes = 0
	e.state = StateUnloaded
	// A request's keep-alive held for the time after that request; the
	// next load starts with the model's own (Ollama does the same).
	e.keepAlive = g.keepAliveOf(e.m.KeepAlive)
	g.metrics.loaded.Add(context.Background(), -1)
}

// Close aborts the loads under way, waits for them to end and stops the
// janitor. Models already loaded stay with the Host, which unloads them
// itself. Later calls return ErrClosed.
func (g *Manager) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	for _, e := range g.entries {
		if e.state == StateLoading {
			e.call.aborted = true
		}
	}
	g.mu.Unlock()
	g.stop()
	g.wg.Wait()
	return g.metrics.close()
}

// ModelStatus is a snapshot of one known model.
type ModelStatus struct {
	ID string
	// Parent is the model a LoRA adapter adapts; empty for a model. The
	// manager itself keeps models only: the Server lists its adapters in
	// their base's state.
	Parent string
	State  State
	// Pinned models are never evicted nor unloaded when idle; a pinned
	// adapter (Parent set) keeps its engine's device slot.
	Pinned bool
	// Busy: requests are queued or running.
	Busy bool
	// Info is what the engine reported at the last load (zero before).
	Info engine.Info
	// MemoryBytes is what the model takes while loaded (or reserves while
	// loading).
	MemoryBytes int64
	// LastUsed is when a request last used the model.
	LastUsed time.Time
	// KeepAlive is the model's keep-alive; negative is forever.
	KeepAlive time.Duration
	// IdleUntil is when the model unloads if no request comes: zero when
	// not loaded, busy, pinned or kept forever.
	IdleUntil time.Time
	// Loads, Evictions count successful loads and unloads for memory or
	// idleness.
	Loads, Evictions int
	// LoadTime is how long the last successful load took.
	LoadTime time.Duration
	// Err is the last failed load while the model is StateFailed.
	Err *LoadError
}

// Status returns a snapshot of every known model, sorted by id.
func (g *Manager) Status() []ModelStatus {
	g.mu.Lock()
	out := make([]ModelStatus, 0, len(g.entries))
	for id, e := range g.entries {
		st := ModelStatus{ID: id, State: e.state, Pinned: e.m.Pin, Info: e.info, MemoryBytes: e.bytes,
			LastUsed: e.lastUsed, KeepAlive: e.keepAlive, Loads: e.loads, Evictions: e.evictions, LoadTime: e.loadTime}
		if e.state == StateFailed {
			st.Err = e.err
		}
		out = append(out, st)
	}
	g.mu.Unlock()
	for i := range out {
		st := &out[i]
		if st.State != StateLoaded {
			continue
		}
		st.Busy = g.host.Busy(st.ID)
		if !st.Busy && !st.Pinned && st.KeepAlive >= 0 {
			st.IdleUntil = st.LastUsed.Add(st.KeepAlive)
		}
	}
	slices.SortFunc(out, func(a, b ModelStatus) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Reserve sets the memory charged for model id beyond what its engine
// reports at load — the LoRA adapter slots a Server allocates once it
// serves adapters over the model — from now on and at every later load.
// A loaded model's charge grows at once, evicting least recently used idle
// models to fit the budget, or fails with a *BudgetError when the rest is
// pinned or busy (the charge stays as it was). A smaller value applies
// from the next load: what the engine allocated stays until the model
// unloads.
func (g *Manager) Reserve(ctx context.Context, id string, bytes int64) error {
	if bytes < 0 {
		return fmt.Errorf("prewarm: Reserve(%q, %d): want 0 or more bytes", id, bytes)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.entries[id]
	if e == nil {
		return fmt.Errorf("%w: %q", ErrUnknownModel, id)
	}
	if e.state == StateLoaded && bytes > e.extra {
		need := bytes - e.extra
		if err := g.fitLocked(ctx, e, need); err != nil {
			return err
		}
		if e = g.entries[id]; e == nil {
			return fmt.Errorf("%w: %q", ErrUnknownModel, id) // forgotten while fitLocked released g.mu
		}
		if e.state == StateLoaded { // else unloaded meanwhile: charged at its next load
			g.used += need
			e.bytes += need
		}
	}
	e.extra = bytes
	return nil
}

// Memory returns the bytes the loaded models take (plus what loads under
// way reserved) and the budget (0: none).
func (g *Manager) Memory() (used, budget int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.used, g.cfg.budget
}

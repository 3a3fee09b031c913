package prewarm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

// startLoadLocked starts loading e on a goroutine of the Manager's and
// returns the call its waiters share. Has to be called with g.mu held.
func (g *Manager) startLoadLocked(e *entry) *loadCall {
	ctx, cancel := context.WithCancel(g.base)
	if g.cfg.loadTimeout > 0 {
		ctx, cancel = context.WithTimeout(g.base, g.cfg.loadTimeout)
	}
	c := &loadCall{done: make(chan struct{}), cancel: cancel}
	e.state, e.call = StateLoading, c
	g.wg.Add(1)
	go g.runLoad(ctx, e, c, e.m.ID(), e.m.Spec)
	return c
}

// runLoad makes room for the model, loads it and records the outcome.
func (g *Manager) runLoad(ctx context.Context, e *entry, c *loadCall, id string, spec engine.ModelSpec) {
	defer g.wg.Done()
	defer c.cancel()
	err := g.makeRoom(ctx, e)
	took := time.Duration(0)
	if err == nil {
		start := time.Now()
		info, lerr := g.host.Load(ctx, spec)
		took = time.Since(start)
		err = g.loaded(ctx, id, e, c, info, lerr, took)
	} else {
		g.mu.Lock()
		if c.aborted || g.closed {
			err = fmt.Errorf("%w: model %q", ErrAborted, id)
		}
		e.state = StateUnloaded
		g.mu.Unlock()
	}
	g.mu.Lock()
	e.call = nil
	if err != nil && e.state == StateLoading {
		e.state = StateUnloaded
	}
	g.mu.Unlock()
	c.err = err
	close(c.done)
	if err == nil {
		g.cfg.logger.Info("model loaded", "model", id, "took", took)
	} else {
		g.cfg.logger.Warn("model not loaded", "model", id, "err", err)
	}
}

// loaded records the end of a host load: the model's memory replaces the
// reservation, or the failure starts a back-off. A load that was aborted
// meanwhile (Unload, Close) is unloaded again.
func (g *Manager) loaded(ctx context.Context, id string, e *entry, c *loadCall, info engine.Info, lerr error, took time.Duration) error {
	g.mu.Lock()
	g.used -= e.bytes
	e.bytes = 0
	aborted := c.aborted || g.closed
	g.mu.Unlock()
	if lerr == nil && aborted {
		_ = g.host.Unload(context.WithoutCancel(ctx), id, false)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case aborted:
		return fmt.Errorf("%w: model %q", ErrAborted, id)
	case lerr != nil:
		g.metrics.load(id, "error", took)
		return g.failLocked(e, lerr)
	}
	g.metrics.load(id, "ok", took)
	g.metrics.loaded.Add(context.Background(), 1)
	e.info = info
	e.bytes = info.MemoryBytes()
	if e.bytes == 0 {
		e.bytes = g.estimateLocked(e)
	}
	e.lastBytes = e.bytes
	e.bytes += e.extra
	g.used += e.bytes
	e.state, e.err, e.failures = StateLoaded, nil, 0
	e.loads++
	e.loadTime = took
	g.lru.Add(id, struct{}{}, 0)
	g.touchLocked(id, e)
	// The engine's report may exceed the estimate: make room now, or give
	// the model up again.
	if err := g.fitLocked(ctx, e, 0); err != nil {
		g.beginUnloadLocked(id, e)
		g.mu.Unlock()
		uerr := g.host.Unload(context.WithoutCancel(ctx), id, false)
		g.mu.Lock()
		g.endUnloadLocked(id, e, uerr)
		return err
	}
	return nil
}

// failLocked puts e in back-off after a failed load. Has to be called
// with g.mu held.
func (g *Manager) failLocked(e *entry, cause error) error {
	e.failures++
	wait := g.cfg.loadBackoff.Backoff(e.failures)
	e.err = &LoadError{Model: e.m.ID(), Attempts: e.failures, RetryAt: time.Now().Add(wait), Err: cause}
	e.state = StateFailed
	return e.err
}

// estimateLocked is the memory e is expected to take: the last load's
// report, the Model's MemoryBytes, or the size of the checkpoint's
// *.safetensors files. Has to be called with g.mu held.
func (g *Manager) estimateLocked(e *entry) int64 {
	switch {
	case e.lastBytes > 0:
		return e.lastBytes
	case e.m.MemoryBytes > 0:
		return e.m.MemoryBytes
	}
	return checkpointBytes(e.m.Spec.Path)
}

// checkpointBytes sums the sizes of dir's *.safetensors files; 0 when
// there are none.
func checkpointBytes(dir string) int64 {
	if dir == "" {
		return 0
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	var n int64
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// makeRoom reserves e's expected memory, evicting least recently used idle
// models until it fits the budget. It fails with a *BudgetError when the
// rest is pinned or busy.
func (g *Manager) makeRoom(ctx context.Context, e *entry) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	need := g.estimateLocked(e)
	if err := g.fitLocked(ctx, e, need); err != nil {
		return err
	}
	g.used += need
	e.bytes = need
	return nil
}

// fitLocked evicts least recently used idle models other than e until
// need more bytes fit the budget. Has to be called with g.mu held; it
// releases it while models unload.
func (g *Manager) fitLocked(ctx context.Context, e *entry, need int64) error {
	budget := g.cfg.budget
	skip := map[string]bool{e.m.ID(): true}
	for budget > 0 && g.used+need > budget {
		id, victim := g.victimLocked(skip)
		if need > budget || victim == nil {
			return &BudgetError{Model: e.m.ID(), Need: max(need, e.bytes), Used: g.used - e.bytes, Budget: budget, Retry: g.cfg.retryAfter}
		}
		if err := g.evictLocked(ctx, id, victim, "budget"); err != nil {
			skip[id] = true
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// victimLocked returns the least recently used loaded model that is not
// pinned, not busy and not in skip. Has to be called with g.mu held.
func (g *Manager) victimLocked(skip map[string]bool) (string, *entry) {
	for _, id := range g.lru.Keys() {
		e := g.entries[id]
		if e == nil || e.state != StateLoaded || e.m.Pin || skip[id] || g.host.Busy(id) {
			continue
		}
		return id, e
	}
	return "", nil
}

// evictLocked unloads an idle model, releasing g.mu while the host works.
// The host refuses (ErrBusy) if a request came in meanwhile. Has to be
// called with g.mu held.
func (g *Manager) evictLocked(ctx context.Context, id string, e *entry, reason string) error {
	g.beginUnloadLocked(id, e)
	g.mu.Unlock()
	err := g.host.Unload(context.WithoutCancel(ctx), id, true)
	g.mu.Lock()
	g.endUnloadLocked(id, e, err)
	if err == nil {
		e.evictions++
		g.metrics.evicted(id, reason)
		g.cfg.logger.Info("model unloaded", "model", id, "reason", reason)
	} else if !errors.Is(err, ErrBusy) {
		g.cfg.logger.Warn("unloading model", "model", id, "err", err)
	}
	return err
}

package prewarm

import "time"

// janitor unloads models whose keep-alive has run out, sleeping until the
// next one is due or the Manager wakes it.
func (g *Manager) janitor() {
	defer g.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		select {
		case <-g.base.Done():
			return
		case <-g.kick:
		case <-t.C:
		}
		next := g.expire()
		t.Stop()
		t.Reset(time.Until(next))
	}
}

// expire unloads every idle model past its keep-alive and returns when the
// next one falls due (an hour from now when none does).
func (g *Manager) expire() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	next := now.Add(time.Hour)
	for id, e := range g.entries {
		if g.closed {
			break
		}
		if e.state != StateLoaded || e.m.Pin || e.keepAlive < 0 || g.host.Busy(id) {
			continue
		}
		due := e.lastUsed.Add(e.keepAlive)
		if due.After(now) {
			if due.Before(next) {
				next = due
			}
			continue
		}
		// evictLocked releases the lock while the host unloads; the map may
		// change meanwhile, which range tolerates.
		_ = g.evictLocked(g.base, id, e, "idle")
	}
	return next
}

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
	var due []string
	for id, e := range g.entries {
		if e.state != StateLoaded || e.m.Pin || e.keepAlive < 0 {
			continue
		}
		if at := e.lastUsed.Add(e.keepAlive); at.After(now) {
			next = minTime(next, at)
		} else {
			due = append(due, id)
		}
	}
	for _, id := range due {
		// evictLocked releases the lock while the host unloads: check
		// again, the model may have been used meanwhile.
		e := g.entries[id]
		if g.closed || e == nil || e.state != StateLoaded || e.m.Pin || e.keepAlive < 0 || g.host.Busy(id) ||
			e.lastUsed.Add(e.keepAlive).After(time.Now()) {
			continue
		}
		_ = g.evictLocked(g.base, id, e, "idle")
	}
	return next
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

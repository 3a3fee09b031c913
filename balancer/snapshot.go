package balancer

import (
	"slices"
	"strings"
	"time"
)

// DefaultLoadRefresh is how often a balancer rebuilds its routing
// snapshot from the backends' load reports.
const DefaultLoadRefresh = 50 * time.Millisecond

// snapshot is what routing reads: every backend with its load report as
// of built, sorted by name. It is never changed once stored; a request
// takes it with one atomic load, calls no backend and waits on no lock
// (grpc-go's picker, built from state, is the model). What must be exact
// is read live beside it: the balancer's own requests in flight, health,
// breaker state and draining.
type snapshot struct {
	// built is when the rebuild began: every report in it is at least
	// that recent.
	built   time.Time
	members []view
}

// view is one backend in a snapshot.
type view struct {
	m    *member
	load Load
}

// Refresh rebuilds the routing snapshot now from every backend's Load.
// The balancer does so itself every load-refresh interval and when
// backends come and go; a program whose local backends load or unload a
// model (or an adapter) calls it so that Load and routing see the change
// at once.
func (lb *LoadBalancer) Refresh() { lb.refresh() }

// refresh rebuilds the snapshot from the members' load reports.
func (lb *LoadBalancer) refresh() {
	lb.refreshMu.Lock()
	defer lb.refreshMu.Unlock()
	lb.rebuild()
}

// refreshSince returns a snapshot built no earlier than t, rebuilding it
// unless a rebuild began since. A request that found no backend for its
// model looks once more this way, in case one appeared (or loaded the
// model) since the last refresh; requests that miss together share one
// rebuild.
func (lb *LoadBalancer) refreshSince(t time.Time) *snapshot {
	lb.refreshMu.Lock()
	defer lb.refreshMu.Unlock()
	if s := lb.snap.Load(); !s.built.Before(t) {
		return s
	}
	lb.rebuild()
	return lb.snap.Load()
}

// rebuild reads the members under lb.mu, then their load reports outside
// it, and stores the new snapshot. Has to be called with refreshMu, so an
// older view never replaces a newer one.
func (lb *LoadBalancer) rebuild() {
	s := &snapshot{built: time.Now()}
	lb.mu.RLock()
	s.members = make([]view, 0, len(lb.members))
	for _, m := range lb.members {
		s.members = append(s.members, view{m: m})
	}
	lb.mu.RUnlock()
	// A stable order, so round robin and ties behave the same every time.
	slices.SortFunc(s.members, func(a, b view) int { return strings.Compare(a.m.name, b.m.name) })
	for i := range s.members {
		s.members[i].load = s.members[i].m.backend.Load()
	}
	lb.snap.Store(s)
}

// report puts a load report m's backend sent into the snapshot now (see
// [LoadReporter]); the other backends' reports stay as they were.
func (lb *LoadBalancer) report(m *member, l Load) {
	lb.refreshMu.Lock()
	defer lb.refreshMu.Unlock()
	old := lb.snap.Load()
	i := slices.IndexFunc(old.members, func(v view) bool { return v.m == m })
	if i < 0 {
		return // removed, or replaced under its name
	}
	s := &snapshot{built: old.built, members: slices.Clone(old.members)}
	s.members[i].load = l
	lb.snap.Store(s)
}

// candidates splits the snapshot's backends that may take r (not tried,
// not draining, serving the model) into healthy ones and doubtful ones
// (failing their health check or with an open breaker).
func (s *snapshot) candidates(r Route, tried map[*member]bool) (healthy, doubtful []view) {
	healthy = make([]view, 0, len(s.members))
	for _, v := range s.members {
		if tried[v.m] || v.m.draining.Load() || v.load.Draining || !v.load.Serves(r.Model) {
			continue
		}
		if v.m.usable() {
			healthy = append(healthy, v)
		} else {
			doubtful = append(doubtful, v)
		}
	}
	return healthy, doubtful
}

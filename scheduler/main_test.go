package scheduler_test

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/scheduler"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a settable clock for WithClock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock { return &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// job is the value type the tests queue.
type job struct {
	name string
	size int
	id   int
}

type entry = scheduler.Entry[*job]

func newEntry(name string, tier api.Tier, cost int) *entry {
	return &entry{Value: &job{name: name, size: cost}, Tier: tier, Cost: cost}
}

// newSched builds a scheduler on clk with opts, failing the test on error.
func newSched(t testing.TB, clk *fakeClock, opts ...scheduler.Option) *scheduler.PriorityScheduler[*job] {
	t.Helper()
	if clk != nil {
		opts = append([]scheduler.Option{scheduler.WithClock(clk.Now)}, opts...)
	}
	s, err := scheduler.New[*job](opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

func mustPush(t testing.TB, s *scheduler.PriorityScheduler[*job], e *entry) {
	t.Helper()
	if err := s.Push(e); err != nil {
		t.Fatalf("Push(%s): %v", e.Value.name, err)
	}
}

// popName pops with an admit-all callback and returns the name, "" if empty.
func popName(t testing.TB, s *scheduler.PriorityScheduler[*job]) string {
	t.Helper()
	next, blocked := s.Pop(func(*job) bool { return true })
	if blocked != nil {
		t.Fatalf("Pop blocked on %s with an admit-all callback", blocked.Value.name)
	}
	if next == nil {
		return ""
	}
	return next.Value.name
}

// popAll pops until the queue is empty and returns the names in order.
func popAll(t testing.TB, s *scheduler.PriorityScheduler[*job]) []string {
	t.Helper()
	var names []string
	for name := popName(t, s); name != ""; name = popName(t, s) {
		names = append(names, name)
	}
	return names
}

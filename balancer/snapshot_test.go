package balancer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/engine"
)

// countingBackend is a backend whose load report says it serves models
// and counts how often it was asked; its streams end at once.
type countingBackend struct {
	routeOnly
	mu     sync.Mutex
	models []string
	loads  atomic.Int64
}

func (c *countingBackend) Load() balancer.Load {
	c.loads.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	return balancer.Load{Models: append([]string(nil), c.models...)}
}

func (c *countingBackend) serve(models ...string) {
	c.mu.Lock()
	c.models = models
	c.mu.Unlock()
}

// TestRoutingCallsNoBackend: requests are routed from the snapshot taken
// when the backends were added; no request asks a backend for its load.
func TestRoutingCallsNoBackend(t *testing.T) {
	lb := newBalancer(t, balancer.WithLoadRefresh(time.Hour), balancer.WithStrategy(balancer.LeastLoaded()))
	bs := make([]*countingBackend, 4)
	for i := range bs {
		bs[i] = &countingBackend{models: []string{"m"}}
		if err := lb.Add(fmt.Sprint("b", i), bs[i]); err != nil {
			t.Fatal(err)
		}
	}
	before := int64(0)
	for _, b := range bs {
		before += b.loads.Load()
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 50 {
				st, err := lb.Generate(context.Background(), request("m", 1))
				if err != nil {
					t.Error(err)
					return
				}
				st.Close()
			}
		})
	}
	wg.Wait()
	_ = lb.Load()
	_ = lb.Stats()
	after := int64(0)
	for _, b := range bs {
		after += b.loads.Load()
	}
	if after != before {
		t.Errorf("200 requests, Load and Stats called backends' Load %d times, want 0", after-before)
	}
	if got := lb.Stats().Routed; got != 200 {
		t.Errorf("routed %d, want 200", got)
	}
}

// TestSnapshotFollowsChanges: a model a backend starts serving after the
// last refresh is found (the request looks again before giving up), a
// removed backend gets nothing more, and the refresh tick picks up load
// reports.
func TestSnapshotFollowsChanges(t *testing.T) {
	lb := newBalancer(t, balancer.WithLoadRefresh(time.Hour))
	a, b := &countingBackend{models: []string{"m"}}, &countingBackend{models: []string{"m"}}
	_ = lb.Add("a", a)
	_ = lb.Add("b", b)
	a.serve("m", "late")
	st, err := lb.Generate(context.Background(), request("late", 1))
	if err != nil {
		t.Fatalf("model loaded after the last refresh: %v", err)
	}
	if got := st.Header().Backend; got != "a" {
		t.Errorf("late model went to %s, want a", got)
	}
	st.Close()
	if _, err := lb.Generate(context.Background(), request("nowhere", 1)); !errors.Is(err, engine.ErrModelNotFound) {
		t.Errorf("unknown model: %v, want ErrModelNotFound", err)
	}
	lb.Remove("a")
	for range 10 {
		st, err := lb.Generate(context.Background(), request("m", 1))
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Header().Backend; got != "b" {
			t.Fatalf("request went to %s after it was removed", got)
		}
		st.Close()
	}

	ticked := newBalancer(t, balancer.WithLoadRefresh(time.Millisecond))
	c := &countingBackend{models: []string{"m"}}
	_ = ticked.Add("c", c)
	c.serve("m", "n")
	deadline := time.Now().Add(5 * time.Second)
	for len(ticked.Load().Models) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("Load().Models = %v after 5 s of 1 ms refreshes", ticked.Load().Models)
		}
		time.Sleep(time.Millisecond)
	}
}

// memStore is an in-memory AffinityStore rtt away (a network round trip
// per call, as Redis on another machine is) that counts its round trips.
type memStore struct {
	rtt        time.Duration
	mu         sync.Mutex
	homes      map[string]string
	gets, sets int
}

func (s *memStore) Get(_ context.Context, key string) (string, error) {
	time.Sleep(s.rtt)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gets++
	return s.homes[key], nil
}

func (s *memStore) Set(_ context.Context, key, backend string, _ time.Duration) error {
	time.Sleep(s.rtt)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sets++
	s.homes[key] = backend
	return nil
}

func (s *memStore) trips() (gets, sets int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gets, s.sets
}

// TestSessionHomesCached: a session's requests after its first reach the
// store only when the copy of its home is older than the refresh interval,
// and a home another replica moved is followed once it is.
func TestSessionHomesCached(t *testing.T) {
	store := &memStore{homes: map[string]string{}}
	const refresh = 200 * time.Millisecond
	lb := newBalancer(t, balancer.WithStrategy(balancer.RoundRobin()),
		balancer.WithAffinityStore(store, 0), balancer.WithAffinityRefresh(refresh))
	for i := range 3 {
		_ = lb.Add(fmt.Sprint("b", i), &countingBackend{models: []string{"m"}})
	}
	turn := func() string {
		req := request("m", 1)
		req.Session = "conv"
		st, err := lb.Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		return st.Header().Backend
	}
	home := turn()
	for i := range 20 {
		if got := turn(); got != home {
			t.Fatalf("turn %d went to %s, home %s", i, got, home)
		}
	}
	if gets, sets := store.trips(); gets != 1 || sets != 1 {
		t.Errorf("21 turns within the refresh interval: %d gets and %d sets, want 1 and 1", gets, sets)
	}
	moved := "b0"
	if home == moved {
		moved = "b1"
	}
	_ = store.Set(context.Background(), "m\x00conv", moved, 0) // another replica moves the home
	deadline := time.Now().Add(5 * time.Second)
	for turn() != moved {
		if time.Now().After(deadline) {
			t.Fatalf("home moved to %s by another replica, still routed to the old one after 5 s", moved)
		}
		time.Sleep(refresh / 4)
	}
}

// reportingBackend sends its load reports to the balancer as they come.
type reportingBackend struct {
	countingBackend
	report func(balancer.Load)
}

func (r *reportingBackend) OnLoad(report func(balancer.Load)) { r.report = report }

// TestReportUpdatesSnapshot: a LoadReporter's report counts for the very
// next request, long before the next refresh.
func TestReportUpdatesSnapshot(t *testing.T) {
	lb := newBalancer(t, balancer.WithLoadRefresh(time.Hour), balancer.WithStrategy(balancer.RoundRobin()))
	a := &reportingBackend{countingBackend: countingBackend{models: []string{"m"}}}
	_ = lb.Add("a", a)
	_ = lb.Add("b", &countingBackend{models: []string{"m"}})
	if a.report == nil {
		t.Fatal("Add did not register for load reports")
	}
	a.report(balancer.Load{Models: []string{"m"}, Draining: true})
	for range 6 {
		st, err := lb.Generate(context.Background(), request("m", 1))
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Header().Backend; got != "b" {
			t.Errorf("routed to %s after it reported draining", got)
		}
		st.Close()
	}
	if l := lb.Stats().Backends[0].Load; !l.Draining {
		t.Errorf("Stats shows a's load as %+v, want its report", l)
	}
}

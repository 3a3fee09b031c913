package lru

import (
	"slices"
	"sync"
	"testing"
	"time"
)

func TestWeightBound(t *testing.T) {
	var evicted []string
	l := New[string, int](10, 0, func(k string, _ int) { evicted = append(evicted, k) })
	l.Add("a", 1, 4)
	l.Add("b", 2, 4)
	l.Get("a") // b is now the least recently used
	l.Add("c", 3, 4)
	if !slices.Equal(evicted, []string{"b"}) || l.Weight() != 8 || !slices.Equal(l.Keys(), []string{"a", "c"}) {
		t.Fatalf("evicted %v, weight %d, keys %v", evicted, l.Weight(), l.Keys())
	}
	l.Add("a", 9, 2) // a replace is no eviction and takes the new weight
	if len(evicted) != 1 || l.Weight() != 6 {
		t.Fatalf("after replace: evicted %v, weight %d", evicted, l.Weight())
	}
	l.Add("huge", 0, 11) // heavier than the bound: everything goes, itself last
	if l.Len() != 0 || l.Weight() != 0 || !slices.Equal(evicted, []string{"b", "c", "a", "huge"}) {
		t.Fatalf("after huge: len %d, weight %d, evicted %v", l.Len(), l.Weight(), evicted)
	}
}

func TestUnboundedAndRemove(t *testing.T) {
	calls := 0
	l := New[int, string](0, 0, func(int, string) { calls++ })
	for i := range 1000 {
		l.Add(i, "x", 1<<40)
	}
	if l.Len() != 1000 || calls != 0 {
		t.Fatalf("len %d, evictions %d", l.Len(), calls)
	}
	if v, ok := l.Remove(7); !ok || v != "x" || l.Contains(7) || calls != 0 {
		t.Fatalf("remove: %q %v, evictions %d", v, ok, calls)
	}
	if _, ok := l.Remove(7); ok {
		t.Fatal("removed twice")
	}
	l.Purge()
	if l.Len() != 0 || l.Weight() != 0 || calls != 999 {
		t.Fatalf("purge: len %d, weight %d, evictions %d", l.Len(), l.Weight(), calls)
	}
}

func TestExpiryOnUse(t *testing.T) {
	now := time.Unix(0, 0)
	var evicted []string
	l := New[string, int](0, time.Minute, func(k string, _ int) { evicted = append(evicted, k) })
	l.SetClock(func() time.Time { return now })
	l.Add("a", 1, 1)
	now = now.Add(30 * time.Second)
	l.Add("b", 2, 1)
	l.Get("a") // use does not extend a TTL
	now = now.Add(30 * time.Second)
	if l.Contains("a") {
		t.Fatal("a outlived its TTL")
	}
	if _, ok := l.Get("a"); ok || !slices.Equal(evicted, []string{"a"}) {
		t.Fatalf("expired a served; evicted %v", evicted)
	}
	l.Add("b", 3, 1) // a replace restarts the TTL
	now = now.Add(59 * time.Second)
	if v, ok := l.Get("b"); !ok || v != 3 || l.Len() != 1 {
		t.Fatalf("b: %d %v", v, ok)
	}
	now = now.Add(time.Second)
	if l.Len() != 0 || l.Weight() != 0 || !slices.Equal(evicted, []string{"a", "b"}) {
		t.Fatalf("len %d, evicted %v", l.Len(), evicted)
	}
}

// Without a TTL the LRU reads no clock: Add, Get, Keys, Len and Weight
// work with one that fails the test.
func TestNoTTLReadsNoClock(t *testing.T) {
	l := New[string, int](2, 0, nil)
	l.SetClock(func() time.Time {
		t.Fatal("clock read by an LRU without a TTL")
		return time.Time{}
	})
	l.Add("a", 1, 1)
	l.Add("b", 2, 1)
	if _, ok := l.Get("a"); !ok {
		t.Fatal("a missing")
	}
	l.Add("c", 3, 1)
	if got := l.Keys(); len(got) != 2 || got[0] != "a" || got[1] != "c" {
		t.Fatalf("Keys = %v, want [a c]", got)
	}
	if l.Len() != 2 || l.Weight() != 2 {
		t.Fatalf("Len %d, Weight %d; want 2, 2", l.Len(), l.Weight())
	}
}

func TestPeekAndOldest(t *testing.T) {
	l := New[string, int](0, 0, nil)
	if _, _, ok := l.Oldest(); ok {
		t.Fatal("an empty LRU has an oldest entry")
	}
	l.Add("a", 1, 1)
	l.Add("b", 2, 1)
	if v, ok := l.Peek("a"); !ok || v != 1 {
		t.Fatalf("peek a: %d %v", v, ok)
	}
	if k, v, ok := l.Oldest(); !ok || k != "a" || v != 1 { // the peek did not mark a used
		t.Fatalf("oldest %q %d %v, want a", k, v, ok)
	}
	l.Get("a")
	if k, _, _ := l.Oldest(); k != "b" {
		t.Fatalf("oldest after get a: %q, want b", k)
	}
	if _, ok := l.Peek("zz"); ok {
		t.Fatal("peeked a missing key")
	}
	now := time.Unix(0, 0)
	e := New[string, int](0, time.Second, nil)
	e.SetClock(func() time.Time { return now })
	e.Add("x", 1, 1)
	now = now.Add(time.Second)
	if _, ok := e.Peek("x"); ok {
		t.Fatal("peeked an expired entry")
	}
	if _, _, ok := e.Oldest(); ok {
		t.Fatal("an expired entry is the oldest")
	}
}

// TestShared: a Shared LRU keeps its bound under concurrent use (run
// with -race).
func TestShared(t *testing.T) {
	s := NewShared[int, int](8)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				s.Add(g*100+i, i)
				if v, ok := s.Get(g*100 + i); ok && v != i {
					t.Errorf("got %d for %d", v, i)
				}
			}
		}()
	}
	wg.Wait()
	if s.Len() != 8 {
		t.Fatalf("len %d, want the bound 8", s.Len())
	}
}

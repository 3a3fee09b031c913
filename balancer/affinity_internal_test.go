package balancer

import (
	"testing"
	"time"
)

// TestAffinityBounds: a home briefly busier than the rest spills requests
// and keeps its sessions; one that stays overloaded past MoveAfter moves
// them; bounds that cannot hold are refused.
func TestAffinityBounds(t *testing.T) {
	b := DefaultAffinityBounds
	t0 := time.Unix(1000, 0)
	var over int64
	steps := []struct {
		pending int
		mean    float64
		at      time.Duration
		want    homeDecision
	}{
		{4, 3, 0, atHome},                    // busier than the mean, under the spill bound
		{10, 4, 0, spilled},                  // past the spill bound: elsewhere once
		{10, 9, 0, atHome},                   // everyone is as busy: home
		{20, 5, time.Second, spilled},        // past the move bound: the clock starts
		{20, 5, 3 * time.Second, spilled},    // still past it, not yet long enough
		{12, 5, 4 * time.Second, spilled},    // below the move bound: the clock stops
		{20, 5, 5 * time.Second, spilled},    // past it again: a new clock
		{20, 5, 9 * time.Second, spilled},    // 4 s of it
		{20, 5, 10*time.Second + 1, moved},   // 5 s: the session moves
		{20, 5, 10*time.Second + 2, spilled}, // and the clock restarts
		{17, 12, 11 * time.Second, atHome},   // past 16 but not 1.5x the mean: home
	}
	for i, s := range steps {
		if got := b.judgeHome(s.pending, s.mean, &over, t0.Add(s.at)); got != s.want {
			t.Errorf("step %d (pending %d, mean %v, at %v): %v, want %v", i, s.pending, s.mean, s.at, got, s.want)
		}
	}
	for _, bad := range []AffinityBounds{
		{SpillPending: -1},
		{SpillFactor: 0.5},
		{SpillPending: 20, MovePending: 10},
		{SpillFactor: 3, MoveFactor: 2},
		{MoveAfter: -time.Second},
	} {
		if _, err := New(WithAffinityBounds(bad)); err == nil {
			t.Errorf("bounds %+v accepted", bad)
		}
	}
	lb, err := New(WithAffinityBounds(AffinityBounds{SpillPending: 4}))
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	if got := lb.cfg.affinityBounds; got.SpillPending != 4 || got.MovePending != 16 || got.MoveAfter != 5*time.Second {
		t.Errorf("zero fields not defaulted: %+v", got)
	}
}

// rendezvous scores are pinned (FNV-1a, then SplitMix64's finaliser), so
// balancers of different builds send a session to the same home.
func TestRendezvousPinned(t *testing.T) {
	for _, c := range []struct {
		key, backend string
		want         uint64
	}{
		{"s1", "a", 0x121cff50b1ccf8c6},
		{"s1", "b", 0x654e4ffc7cb79b65},
		{"user-42", "gpu-7", 0x4bb312a6c066ac01},
	} {
		if got := rendezvous(c.key, c.backend); got != c.want {
			t.Errorf("rendezvous(%q, %q) = %#x, want %#x", c.key, c.backend, got, c.want)
		}
	}
}

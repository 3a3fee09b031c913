package scheduler_test

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/scheduler"
)

// TestConcurrent pushes and removes from many goroutines while one
// consumer pops (refusing some candidates and requeueing some entries)
// and another reads Stats; every entry must end popped or removed exactly
// once.
func TestConcurrent(t *testing.T) {
	const pushers, each = 8, 400
	s := newSched(t, nil, scheduler.WithMaxQueued(0), scheduler.WithRateLimit(1e9, 1<<20))
	entries := make([]*entry, pushers*each)
	var popped, removed [pushers * each]atomic.Int32
	var wg sync.WaitGroup
	for p := range pushers {
		wg.Go(func() {
			tiers := api.Tiers()
			for i := range each {
				id := p*each + i
				e := newEntry(strconv.Itoa(id), tiers[id%len(tiers)], 1+id%97)
				e.Value.id, e.Client = id, "client-"+strconv.Itoa(id%13)
				entries[id] = e
				if err := s.Push(e); err != nil {
					t.Errorf("Push %d: %v", id, err)
					return
				}
				if i%5 == 0 && s.Remove(e) {
					removed[id].Add(1)
				}
			}
		})
	}
	pushed := make(chan struct{})
	go func() { wg.Wait(); close(pushed) }()
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readers.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				s.Stats()
				s.Len()
			}
		}
	})

	rng := rand.New(rand.NewPCG(1, 2))
	requeued := map[int]bool{}
	admit := func(*job) bool { return rng.IntN(10) != 0 }
	finished := false
	for !finished {
		next, blocked := s.Pop(admit)
		switch {
		case next != nil && next.Value.id%7 == 0 && !requeued[next.Value.id]:
			requeued[next.Value.id] = true
			s.Requeue(next) // preempted: runs again later
		case next != nil:
			popped[next.Value.id].Add(1)
		case blocked != nil:
		default:
			select {
			case <-s.Ready():
			case <-pushed:
				if n, _ := s.Len(); n == 0 {
					finished = true
				}
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	close(stop)
	readers.Wait()
	for id := range entries {
		if p, r := popped[id].Load(), removed[id].Load(); p+r != 1 {
			t.Errorf("entry %d popped %d times, removed %d times", id, p, r)
		}
	}
	st := s.Stats()
	if st.Pushed != pushers*each || st.Popped+st.Removed != st.Pushed+st.Requeued || st.Queued != 0 || st.QueuedTokens != 0 {
		t.Errorf("Stats after the run: %+v", st)
	}
}

package scheduler_test

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/scheduler"
)

// fill queues n entries of mixed tiers and costs.
func fill(b *testing.B, s *scheduler.PriorityScheduler[*job], rng *rand.Rand, n int) {
	tiers := api.Tiers()
	for i := range n {
		e := newEntry("fill", tiers[i%len(tiers)], 1+rng.IntN(4096))
		if err := s.Push(e); err != nil {
			b.Fatalf("fill %d: %v", i, err)
		}
	}
}

// BenchmarkPushPop pushes one entry and pops one per operation with n
// entries waiting, on the real clock.
func BenchmarkPushPop(b *testing.B) {
	for _, n := range []int{0, 10000} {
		b.Run("queued="+strconv.Itoa(n), func(b *testing.B) {
			s := newSched(b, nil, scheduler.WithMaxQueued(0))
			rng := rand.New(rand.NewPCG(1, 1))
			fill(b, s, rng, n)
			tiers := api.Tiers()
			entries := make([]*entry, 1024)
			for i := range entries {
				entries[i] = newEntry("x", tiers[i%len(tiers)], 1+rng.IntN(4096))
			}
			admit := func(*job) bool { return true }
			i := 0
			for b.Loop() {
				if err := s.Push(entries[i%len(entries)]); err != nil {
					// The entry is still queued from an earlier lap: pop more.
					b.StopTimer()
					s.Pop(admit)
					b.StartTimer()
				}
				s.Pop(admit)
				i++
			}
		})
	}
}

// BenchmarkPushPopAging is BenchmarkPushPop at 10k queued with a clock
// that moves 1 ms per operation and 100 ms aging and promotion, so entries
// keep changing band: it measures that upkeep too.
func BenchmarkPushPopAging(b *testing.B) {
	clk := newClock()
	s := newSched(b, clk, scheduler.WithMaxQueued(0), scheduler.WithAging(100*time.Millisecond),
		scheduler.WithSLA(api.Low, 200*time.Millisecond), scheduler.WithSLA(api.Background, 400*time.Millisecond))
	rng := rand.New(rand.NewPCG(2, 2))
	fill(b, s, rng, 10000)
	tiers := api.Tiers()
	admit := func(*job) bool { return true }
	i := 0
	for b.Loop() {
		clk.Advance(time.Millisecond)
		e := newEntry("x", tiers[i%len(tiers)], 1+rng.IntN(4096))
		if err := s.Push(e); err != nil {
			b.Fatal(err)
		}
		s.Pop(admit)
		i++
	}
}

// BenchmarkPopBlocked measures a Pop whose candidate does not fit, the
// batcher's common case while its batch is full, at 10k queued.
func BenchmarkPopBlocked(b *testing.B) {
	s := newSched(b, nil, scheduler.WithMaxQueued(0))
	fill(b, s, rand.New(rand.NewPCG(3, 3)), 10000)
	refuse := func(*job) bool { return false }
	for b.Loop() {
		if next, blocked := s.Pop(refuse); next != nil || blocked == nil {
			b.Fatal("Pop did not block")
		}
	}
}

// BenchmarkRejectQueueFull measures how fast Push refuses when 10,000
// requests are queued.
func BenchmarkRejectQueueFull(b *testing.B) {
	s := newSched(b, nil, scheduler.WithMaxQueued(10000))
	fill(b, s, rand.New(rand.NewPCG(4, 4)), 8000) // background stops at 80%
	for range 2000 {
		mustPush(b, s, newEntry("crit", api.Critical, 100))
	}
	if n, _ := s.Len(); n != 10000 {
		b.Fatalf("queued %d", n)
	}
	e := newEntry("refused", api.Critical, 100)
	for b.Loop() {
		if err := s.Push(e); !errors.Is(err, scheduler.ErrQueueFull) {
			b.Fatalf("Push: %v", err)
		}
	}
}

// BenchmarkRejectRateLimited measures a refusal by a client's rate limit
// with 10,000 clients in the table.
func BenchmarkRejectRateLimited(b *testing.B) {
	s := newSched(b, nil, scheduler.WithMaxQueued(0), scheduler.WithRateLimit(1e-3, 1))
	for i := range 10000 {
		e := newEntry("x", api.Normal, 1)
		e.Client = "client-" + strconv.Itoa(i)
		mustPush(b, s, e)
	}
	e := newEntry("x", api.Normal, 1)
	e.Client = "client-42"
	for b.Loop() {
		if err := s.Push(e); !errors.Is(err, scheduler.ErrRateLimited) {
			b.Fatalf("Push: %v", err)
		}
	}
}

// BenchmarkPushParallel pushes from every CPU at once (each push is then
// removed, as a cancelled request would be) with 10k queued: the cost of
// the lock under contention.
func BenchmarkPushParallel(b *testing.B) {
	s := newSched(b, nil, scheduler.WithMaxQueued(0))
	fill(b, s, rand.New(rand.NewPCG(5, 5)), 10000)
	b.RunParallel(func(pb *testing.PB) {
		e := newEntry("x", api.High, 100)
		for pb.Next() {
			if err := s.Push(e); err != nil {
				b.Error(err)
				return
			}
			s.Remove(e)
		}
	})
}

package scheduler_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/scheduler"
)

func TestMaxQueued(t *testing.T) {
	s := newSched(t, newClock(), scheduler.WithMaxQueued(3), scheduler.WithHeadroom(0))
	for i := range 3 {
		mustPush(t, s, newEntry(string(rune('a'+i)), api.Normal, 10))
	}
	err := s.Push(newEntry("d", api.Critical, 10))
	var full *scheduler.QueueFullError
	if !errors.Is(err, scheduler.ErrQueueFull) || !errors.As(err, &full) {
		t.Fatalf("Push beyond the bound: %v", err)
	}
	if full.Queued != 3 || full.MaxQueued != 3 || full.QueuedTokens != 30 {
		t.Errorf("QueueFullError = %+v", full)
	}
	// Nothing was drained yet: the honest answer is the longest wait.
	if full.RetryAfter != scheduler.MaxRetryAfter {
		t.Errorf("RetryAfter before any drain = %s, want %s", full.RetryAfter, scheduler.MaxRetryAfter)
	}
	if want := "queue full: 3 requests queued (limit 3 for critical), retry after 1m0s"; err.Error() != want {
		t.Errorf("message %q, want %q", err, want)
	}
	if st := s.Stats(); st.Rejected != 1 || st.Tier(api.Critical).Rejected != 1 {
		t.Errorf("Stats rejected = %d, critical %d", st.Rejected, st.Tier(api.Critical).Rejected)
	}
	if n, _ := s.Len(); n != 3 {
		t.Errorf("Len = %d after a refused push", n)
	}
}

// TestHeadroom fills the queue tier by tier, least urgent first: each tier
// is refused at its share of the bound, and critical can still fill it.
func TestHeadroom(t *testing.T) {
	for _, bound := range []struct {
		opt  scheduler.Option
		cost int
	}{{scheduler.WithMaxQueued(100), 1}, {scheduler.WithMaxQueuedTokens(1000), 10}} {
		s := newSched(t, newClock(), scheduler.WithMaxQueued(0), bound.opt)
		tiers := api.Tiers()
		for i := len(tiers) - 1; i >= 0; i-- {
			tier := tiers[i]
			for {
				err := s.Push(newEntry(tier.String(), tier, bound.cost))
				var full *scheduler.QueueFullError
				if errors.As(err, &full) {
					if full.Tier != tier {
						t.Errorf("refusal names tier %v, want %v", full.Tier, tier)
					}
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			want := 100 - 5*i // critical 100, high 95, ... background 80
			if n, _ := s.Len(); n != want {
				t.Errorf("%v refused at %d queued, want %d", tier, n, want)
			}
		}
	}
	// Tiny bounds keep at least one place for every tier.
	s := newSched(t, newClock(), scheduler.WithMaxQueued(1))
	mustPush(t, s, newEntry("bg", api.Background, 1))
}

func TestMaxQueuedTokens(t *testing.T) {
	s := newSched(t, newClock(), scheduler.WithMaxQueued(0), scheduler.WithMaxQueuedTokens(1000), scheduler.WithHeadroom(0))
	mustPush(t, s, newEntry("600", api.Normal, 600))
	err := s.Push(newEntry("500", api.Normal, 500))
	var full *scheduler.QueueFullError
	if !errors.As(err, &full) || full.QueuedTokens != 600 || full.Cost != 500 || full.MaxQueuedTokens != 1000 {
		t.Fatalf("Push over the token bound: %v (%+v)", err, full)
	}
	if !strings.Contains(err.Error(), "600 tokens queued + 500 requested exceeds the limit of 1000 tokens for normal") {
		t.Errorf("message %q", err)
	}
	mustPush(t, s, newEntry("400", api.Normal, 400)) // exactly at the bound
	if err := s.Push(newEntry("1", api.Normal, 1)); !errors.Is(err, scheduler.ErrQueueFull) {
		t.Fatalf("Push at the bound: %v", err)
	}

	// An entry larger than the whole bound still runs, alone.
	s = newSched(t, newClock(), scheduler.WithMaxQueuedTokens(1000))
	mustPush(t, s, newEntry("huge", api.Normal, 5000))
	if err := s.Push(newEntry("1", api.Normal, 1)); !errors.Is(err, scheduler.ErrQueueFull) {
		t.Fatalf("Push behind an oversize entry: %v", err)
	}
}

// TestRetryAfterFollowsDrainRate drains 100 tokens every 500 ms (200
// tokens/s) from a full queue of ten 100-token entries, so RetryAfter
// should settle at 1000/200 = 5 s.
func TestRetryAfterFollowsDrainRate(t *testing.T) {
	clk := newClock()
	s := newSched(t, clk, scheduler.WithMaxQueued(10), scheduler.WithHeadroom(0))
	for range 10 {
		mustPush(t, s, newEntry("x", api.Normal, 100))
	}
	for range 40 {
		clk.Advance(500 * time.Millisecond)
		popName(t, s)
		mustPush(t, s, newEntry("x", api.Normal, 100))
	}
	var full *scheduler.QueueFullError
	if err := s.Push(newEntry("x", api.Normal, 100)); !errors.As(err, &full) {
		t.Fatalf("Push on a full queue: %v", err)
	}
	if d := full.RetryAfter - 5*time.Second; d < -50*time.Millisecond || d > 50*time.Millisecond {
		t.Errorf("RetryAfter = %s, want about 5s", full.RetryAfter)
	}
	if r := s.Stats().DrainRate; r < 195 || r > 205 {
		t.Errorf("DrainRate = %.1f tokens/s, want about 200", r)
	}

	// A fast drain is clamped to the minimum.
	for range 40 {
		clk.Advance(time.Millisecond)
		popName(t, s)
		mustPush(t, s, newEntry("x", api.Normal, 100))
	}
	clk.Advance(300 * time.Millisecond) // a stall of 300 ms lowers the rate but not to zero
	if err := s.Push(newEntry("x", api.Normal, 100)); !errors.As(err, &full) || full.RetryAfter < scheduler.MinRetryAfter || full.RetryAfter >= 5*time.Second {
		t.Errorf("RetryAfter after a fast drain: %v", err)
	}
}

func TestRequeueIgnoresBounds(t *testing.T) {
	clk := newClock()
	s := newSched(t, clk, scheduler.WithMaxQueued(2), scheduler.WithRateLimit(1, 1))
	a := newEntry("a", api.Normal, 10)
	a.Client = "c1"
	mustPush(t, s, a)
	next, _ := s.Pop(nil)
	if next != a {
		t.Fatalf("Pop = %v", next)
	}
	mustPush(t, s, newEntry("b", api.Normal, 10))
	mustPush(t, s, newEntry("c", api.Normal, 10))
	enq := a.Enqueued
	clk.Advance(time.Second)
	s.Requeue(a)
	if n, tokens := s.Len(); n != 3 || tokens != 30 {
		t.Fatalf("Len after Requeue = %d, %d; want 3, 30", n, tokens)
	}
	if !a.Enqueued.Equal(enq) {
		t.Errorf("Requeue changed Enqueued from %v to %v", enq, a.Enqueued)
	}
	s.Requeue(a) // already queued: ignored
	if n, _ := s.Len(); n != 3 {
		t.Fatalf("double Requeue queued it twice: Len %d", n)
	}
	if st := s.Stats(); st.Requeued != 1 || st.Popped != 1 || st.Pushed != 3 {
		t.Errorf("Stats = %+v", st)
	}
}

// TestRequeueKeepsAge: a preempted entry comes back with its original
// enqueue time, so after waiting past its deadline it goes first.
func TestRequeueKeepsAge(t *testing.T) {
	clk := newClock()
	s := newSched(t, clk)
	a := newEntry("a", api.Normal, 1000)
	mustPush(t, s, a)
	if next, _ := s.Pop(nil); next != a {
		t.Fatal("Pop did not return a")
	}
	clk.Advance(3 * time.Second) // a ran, then was preempted
	mustPush(t, s, newEntry("b", api.Normal, 10))
	s.Requeue(a)
	if got := popAll(t, s); len(got) != 2 || got[0] != "a" {
		t.Fatalf("order %v, want a first", got)
	}
	if w := s.Stats().Tier(api.Normal); w.Waits != 2 || w.WaitP99 != 0 {
		t.Errorf("waits %d p99 %s: want 2 first-pop waits of 0 (a requeued entry's wait is not counted again)", w.Waits, w.WaitP99)
	}

	// An entry that was never pushed is stamped as Push would.
	fresh := &entry{Value: &job{name: "fresh"}, Tier: api.High}
	s.Requeue(fresh)
	if fresh.Enqueued.IsZero() || !fresh.Deadline.Equal(fresh.Enqueued.Add(500*time.Millisecond)) || fresh.Cost != 1 {
		t.Errorf("Requeue of a new entry: enqueued %v deadline %v cost %d", fresh.Enqueued, fresh.Deadline, fresh.Cost)
	}
	s.Requeue(nil)
	if got := popAll(t, s); len(got) != 1 || got[0] != "fresh" {
		t.Errorf("queue after Requeue(fresh) = %v", got)
	}
}

func TestRateLimit(t *testing.T) {
	clk := newClock()
	s := newSched(t, clk, scheduler.WithRateLimit(2, 3))
	push := func(client string) error {
		e := newEntry(client, api.Normal, 1)
		e.Client = client
		return s.Push(e)
	}
	for i := range 3 {
		if err := push("a"); err != nil {
			t.Fatalf("burst push %d: %v", i, err)
		}
	}
	err := push("a")
	var rl *scheduler.RateLimitError
	if !errors.Is(err, scheduler.ErrRateLimited) || !errors.As(err, &rl) {
		t.Fatalf("push over the burst: %v", err)
	}
	if rl.Client != "a" || rl.RetryAfter != 500*time.Millisecond {
		t.Errorf("RateLimitError = %+v, want client a, retry after 500ms", rl)
	}
	if want := `rate limited: client "a" is over 2 requests/s (burst 3), retry after 500ms`; err.Error() != want {
		t.Errorf("message %q", err)
	}
	if err := push("b"); err != nil {
		t.Errorf("other client limited: %v", err)
	}
	for range 10 {
		if err := push(""); err != nil {
			t.Fatalf("anonymous push limited: %v", err)
		}
	}
	clk.Advance(250 * time.Millisecond)
	if err := push("a"); !errors.As(err, &rl) || rl.RetryAfter != 250*time.Millisecond {
		t.Errorf("after 250ms: %v", err)
	}
	clk.Advance(250 * time.Millisecond)
	if err := push("a"); err != nil {
		t.Errorf("after 500ms: %v", err)
	}
	st := s.Stats()
	if st.RateLimited != 2 || st.Tier(api.Normal).RateLimited != 2 {
		t.Errorf("Stats RateLimited = %d", st.RateLimited)
	}
	// A refused push spends no token: the queue bound refuses before the
	// limiter is asked.
	s = newSched(t, clk, scheduler.WithRateLimit(1, 1), scheduler.WithMaxQueued(1))
	mustPush(t, s, newEntry("x", api.Normal, 1))
	e := newEntry("y", api.Normal, 1)
	e.Client = "c"
	if err := s.Push(e); !errors.Is(err, scheduler.ErrQueueFull) {
		t.Fatalf("push on full queue: %v", err)
	}
	popName(t, s)
	if err := s.Push(e); err != nil {
		t.Errorf("client c lost its token to a refused push: %v", err)
	}
}

// TestRateLimitTableIsBounded: the table keeps the most recent clients
// only, so a client pushed out starts again with a full bucket.
func TestRateLimitTableIsBounded(t *testing.T) {
	s := newSched(t, newClock(), scheduler.WithRateLimit(1, 1), scheduler.WithRateLimitClients(2), scheduler.WithMaxQueued(0))
	push := func(client string) error {
		e := newEntry(client, api.Low, 1)
		e.Client = client
		return s.Push(e)
	}
	for _, c := range []string{"a", "b"} {
		if err := push(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := push("a"); !errors.Is(err, scheduler.ErrRateLimited) {
		t.Fatalf("a within the table: %v", err)
	}
	for i := range 10000 { // a flood of ids
		if err := push("flood-" + strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := push("a"); err != nil {
		t.Errorf("a after eviction should start with a full bucket: %v", err)
	}
}

package scheduler_test

import (
	"slices"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/scheduler"
)

// push is one step of an ordering scenario: wait, then push.
type push struct {
	after time.Duration // clock advance before this push
	name  string
	tier  api.Tier
	cost  int
}

func TestOrder(t *testing.T) {
	const (
		bg, low, normal = api.Background, api.Low, api.Normal
		high, crit      = api.High, api.Critical
	)
	noDrift := []scheduler.Option{scheduler.WithAging(0), scheduler.WithPromotion(0)}
	tests := []struct {
		name   string
		opts   []scheduler.Option
		pushes []push
		before time.Duration // clock advance before popping
		want   []string
	}{
		{"tiers most urgent first", noDrift, []push{
			{0, "bg", bg, 10}, {0, "low", low, 10}, {0, "normal", normal, 10}, {0, "high", high, 10}, {0, "crit", crit, 10},
		}, 0, []string{"crit", "high", "normal", "low", "bg"}},
		{"tier beats cost", noDrift, []push{
			{0, "normal-small", normal, 1}, {0, "high-huge", high, 100000},
		}, 0, []string{"high-huge", "normal-small"}},
		{"shortest job first inside a tier", noDrift, []push{
			{0, "300", normal, 300}, {0, "100", normal, 100}, {0, "200", normal, 200},
		}, 0, []string{"100", "200", "300"}},
		{"equal cost: earliest first, then push order", noDrift, []push{
			{0, "a", low, 50}, {0, "b", low, 50}, {time.Millisecond, "c", low, 50},
		}, 0, []string{"a", "b", "c"}},
		{"promotion: big job near its deadline overtakes small ones", nil, []push{
			{0, "big", normal, 5000}, {1100 * time.Millisecond, "small", normal, 10},
		}, 0, []string{"big", "small"}},
		{"promotion: not yet near the deadline, SJF holds", nil, []push{
			{0, "big", normal, 5000}, {900 * time.Millisecond, "small", normal, 10},
		}, 0, []string{"small", "big"}},
		{"promotion stays inside the tier", nil, []push{
			{0, "normal-late", normal, 10}, {1900 * time.Millisecond, "high", high, 9000},
		}, 0, []string{"high", "normal-late"}},
		{"promoted entries run earliest deadline first", nil, []push{
			{0, "first", normal, 900}, {100 * time.Millisecond, "second", normal, 100},
		}, 1700 * time.Millisecond, []string{"first", "second"}},
		{"promoted low outranks normal? no: tiers stay strict", []scheduler.Option{scheduler.WithAging(0)}, []push{
			{0, "low", low, 1}, {9 * time.Second, "normal", normal, 1000},
		}, 0, []string{"normal", "low"}},
		{"aging: background waits 2 intervals and ranks as normal", []scheduler.Option{scheduler.WithAging(time.Second), scheduler.WithPromotion(0)}, []push{
			{0, "bg", bg, 10}, {2100 * time.Millisecond, "normal", normal, 100},
		}, 0, []string{"bg", "normal"}},
		{"aging: after 1 interval background is only low", []scheduler.Option{scheduler.WithAging(time.Second), scheduler.WithPromotion(0)}, []push{
			{0, "bg", bg, 10}, {1100 * time.Millisecond, "normal", normal, 100},
		}, 0, []string{"normal", "bg"}},
		{"aging past high puts it ahead of high, never of critical", []scheduler.Option{scheduler.WithAging(time.Second), scheduler.WithPromotion(0)}, []push{
			{0, "bg", bg, 1000}, {4 * time.Second, "high", high, 1}, {0, "crit", crit, 1},
		}, 0, []string{"crit", "bg", "high"}},
		{"an aged entry is promoted as a fresh arrival of its new tier would be", []scheduler.Option{scheduler.WithAging(2 * time.Second)}, []push{
			{0, "low-big", low, 9000}, {3100 * time.Millisecond, "normal-small", normal, 1},
		}, 0, []string{"low-big", "normal-small"}},
		{"an aged entry before that point runs shortest job first", []scheduler.Option{scheduler.WithAging(2 * time.Second)}, []push{
			{0, "low-big", low, 9000}, {2900 * time.Millisecond, "normal-small", normal, 1},
		}, 0, []string{"normal-small", "low-big"}},
		{"a critical near its deadline goes first among criticals", nil, []push{
			{0, "crit-big", crit, 8000}, {90 * time.Millisecond, "crit-small", crit, 1},
		}, 0, []string{"crit-big", "crit-small"}},
		{"background has no SLA: no promotion", []scheduler.Option{scheduler.WithAging(0)}, []push{
			{0, "bg-big", bg, 8000}, {time.Hour, "bg-small", bg, 1},
		}, 0, []string{"bg-small", "bg-big"}},
		{"custom SLA drives promotion", []scheduler.Option{scheduler.WithSLA(api.Background, time.Second), scheduler.WithAging(0)}, []push{
			{0, "bg-big", bg, 8000}, {900 * time.Millisecond, "bg-small", bg, 1},
		}, 0, []string{"bg-big", "bg-small"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newClock()
			s := newSched(t, clk, tt.opts...)
			for _, p := range tt.pushes {
				clk.Advance(p.after)
				mustPush(t, s, newEntry(p.name, p.tier, p.cost))
			}
			clk.Advance(tt.before)
			if got := popAll(t, s); !slices.Equal(got, tt.want) {
				t.Errorf("pop order %v, want %v", got, tt.want)
			}
		})
	}
}

// TestAgingPreventsStarvation feeds a constant stream of high work that
// fills every pop, and checks a background entry still runs — after four
// aging intervals, when it ranks as high, and 250 ms later, when it is
// promoted as a high request arriving then would be — and that without
// aging it never does.
func TestAgingPreventsStarvation(t *testing.T) {
	for _, aging := range []time.Duration{time.Second, 0} {
		clk := newClock()
		s := newSched(t, clk, scheduler.WithAging(aging))
		mustPush(t, s, newEntry("bg", api.Background, 100)) // larger than any high job
		ranAt, want := time.Duration(-1), 3*aging+250*time.Millisecond
		const tick = 10 * time.Millisecond
		for step := range 6000 { // one minute of simulated time
			mustPush(t, s, newEntry("high", api.High, 5))
			clk.Advance(tick)
			if popName(t, s) == "bg" {
				ranAt = time.Duration(step+1) * tick
				break
			}
		}
		switch {
		case aging > 0 && (ranAt < want || ranAt > want+2*tick):
			t.Errorf("aging %s: background ran at %s, want just after %s", aging, ranAt, want)
		case aging == 0 && ranAt >= 0:
			t.Errorf("aging off: background ran at %s under a constant stream of high work", ranAt)
		}
	}
}

// TestAgingNeverReachesCritical: critical work keeps its SLA whatever
// waits, so a constant critical stream does hold back aged work.
func TestAgingNeverReachesCritical(t *testing.T) {
	clk := newClock()
	s := newSched(t, clk, scheduler.WithAging(time.Millisecond))
	mustPush(t, s, newEntry("bg", api.Background, 1))
	for range 1000 {
		mustPush(t, s, newEntry("crit", api.Critical, 1000))
		clk.Advance(10 * time.Millisecond)
		if got := popName(t, s); got != "crit" {
			t.Fatalf("popped %q before a waiting critical entry", got)
		}
	}
}

func TestBlockedIsStrict(t *testing.T) {
	s := newSched(t, newClock())
	mustPush(t, s, newEntry("crit-big", api.Critical, 1000))
	mustPush(t, s, newEntry("low-small", api.Low, 1))
	fits := func(j *job) bool { return j.size <= 100 }
	next, blocked := s.Pop(fits)
	if next != nil || blocked == nil || blocked.Value.name != "crit-big" {
		t.Fatalf("Pop = %v, %v; want nil, crit-big", next, blocked)
	}
	if n, tokens := s.Len(); n != 2 || tokens != 1001 {
		t.Fatalf("Len after a blocked Pop = %d, %d; want 2, 1001", n, tokens)
	}
	if got := popAll(t, s); !slices.Equal(got, []string{"crit-big", "low-small"}) {
		t.Fatalf("order after unblocking %v", got)
	}
	if next, blocked := s.Pop(fits); next != nil || blocked != nil {
		t.Fatalf("Pop on empty = %v, %v", next, blocked)
	}
}

// TestUrgentRunsFirstInItsTier: an urgent entry (a stream resumed here)
// runs before the rest of its tier whatever its cost, earliest urgent
// first, and never ahead of a higher tier.
func TestUrgentRunsFirstInItsTier(t *testing.T) {
	clk := newClock()
	s := newSched(t, clk, scheduler.WithAging(0), scheduler.WithPromotion(0))
	mustPush(t, s, newEntry("small", api.Normal, 1))
	clk.Advance(time.Millisecond)
	big := newEntry("resumed-big", api.Normal, 9000)
	big.Urgent = true
	mustPush(t, s, big)
	clk.Advance(time.Millisecond)
	later := newEntry("resumed-later", api.Normal, 5)
	later.Urgent = true
	mustPush(t, s, later)
	mustPush(t, s, newEntry("high", api.High, 100))
	if got, want := popAll(t, s), []string{"high", "resumed-big", "resumed-later", "small"}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}

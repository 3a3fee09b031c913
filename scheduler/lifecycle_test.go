package scheduler_test

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/scheduler"
)

func TestRemove(t *testing.T) {
	s := newSched(t, newClock())
	a, b, c := newEntry("a", api.High, 1), newEntry("b", api.High, 2), newEntry("c", api.High, 3)
	for _, e := range []*entry{a, b, c} {
		mustPush(t, s, e)
	}
	if !s.Remove(b) {
		t.Fatal("Remove(b) = false for a queued entry")
	}
	if s.Remove(b) {
		t.Error("second Remove(b) = true")
	}
	if n, tokens := s.Len(); n != 2 || tokens != 4 {
		t.Errorf("Len = %d, %d; want 2, 4", n, tokens)
	}
	if got := popName(t, s); got != "a" {
		t.Fatalf("Pop = %s", got)
	}
	if s.Remove(a) {
		t.Error("Remove of a popped entry = true")
	}
	other := newSched(t, newClock())
	if other.Remove(c) || s.Remove(nil) {
		t.Error("Remove of a foreign or nil entry = true")
	}
	if got := popAll(t, s); !slices.Equal(got, []string{"c"}) {
		t.Errorf("rest = %v", got)
	}
	if st := s.Stats(); st.Removed != 1 {
		t.Errorf("Stats.Removed = %d", st.Removed)
	}
}

// TestRemoveDuringAdmit: admit runs without the lock, and the candidate
// can be cancelled meanwhile; Pop must not return it.
func TestRemoveDuringAdmit(t *testing.T) {
	s := newSched(t, newClock())
	a, b := newEntry("a", api.High, 1), newEntry("b", api.High, 2)
	mustPush(t, s, a)
	mustPush(t, s, b)
	next, blocked := s.Pop(func(j *job) bool {
		if j.name == "a" {
			s.Remove(a) // the caller cancelled a while we were deciding
		}
		return true
	})
	if blocked != nil || next != b {
		t.Fatalf("Pop = %v, %v; want b", next, blocked)
	}
	if n, _ := s.Len(); n != 0 {
		t.Errorf("Len = %d", n)
	}
}

func TestCloseAndDrain(t *testing.T) {
	clk := newClock()
	s := newSched(t, clk)
	for _, p := range []push{{0, "low", api.Low, 1}, {0, "crit", api.Critical, 5}, {0, "normal", api.Normal, 2}} {
		mustPush(t, s, newEntry(p.name, p.tier, p.cost))
	}
	popped, _ := s.Pop(nil)
	<-s.Ready() // drain the pending signal from the pushes
	s.Close()
	s.Close()
	select {
	case <-s.Ready():
	default:
		t.Error("Close did not signal Ready")
	}
	if err := s.Push(newEntry("late", api.Critical, 1)); !errors.Is(err, scheduler.ErrClosed) {
		t.Errorf("Push after Close: %v", err)
	}
	s.Requeue(popped) // preempted after Close: still handed back by Drain
	var names []string
	for _, e := range s.Drain() {
		names = append(names, e.Value.name)
	}
	if want := []string{"crit", "normal", "low"}; !slices.Equal(names, want) {
		t.Errorf("Drain = %v, want %v", names, want)
	}
	if n, tokens := s.Len(); n != 0 || tokens != 0 || len(s.Drain()) != 0 {
		t.Errorf("after Drain: Len %d, %d", n, tokens)
	}
}

func TestReady(t *testing.T) {
	s := newSched(t, nil)
	select {
	case <-s.Ready():
		t.Fatal("Ready fired on an empty scheduler")
	default:
	}
	for range 3 { // sends never block
		mustPush(t, s, newEntry("x", api.Normal, 1))
	}
	<-s.Ready()
	select {
	case <-s.Ready():
		t.Fatal("Ready holds more than one signal")
	default:
	}
	e, _ := s.Pop(nil)
	s.Requeue(e)
	<-s.Ready()
}

func TestPreempts(t *testing.T) {
	on := newSched(t, nil, scheduler.WithPreemption(true))
	off := newSched(t, nil)
	for _, w := range api.Tiers() {
		for _, r := range api.Tiers() {
			want := w == api.Critical && r != api.Critical
			if got := on.Preempts(w, r); got != want {
				t.Errorf("Preempts(%v, %v) = %v, want %v", w, r, got, want)
			}
			if off.Preempts(w, r) {
				t.Errorf("Preempts(%v, %v) with preemption off", w, r)
			}
		}
	}
	if on.Preempts(api.Critical, api.Tier(99)) != true || on.Preempts(api.Tier(99), api.Background) {
		t.Error("Preempts with an invalid tier")
	}
}

func TestBadEntries(t *testing.T) {
	s := newSched(t, nil)
	queued := newEntry("q", api.Normal, 1)
	mustPush(t, s, queued)
	tests := []struct {
		name string
		e    *entry
		want error
		msg  string
	}{
		{"nil", nil, scheduler.ErrInvalidEntry, "nil entry"},
		{"unknown tier", newEntry("x", api.Tier(7), 1), api.ErrUnknownTier, `unknown tier "Tier(7)"`},
		{"zero cost", newEntry("x", api.Normal, 0), scheduler.ErrInvalidEntry, "cost 0: must be at least 1"},
		{"negative cost", newEntry("x", api.Normal, -5), scheduler.ErrInvalidEntry, "cost -5"},
		{"already queued", queued, scheduler.ErrInvalidEntry, "already queued"},
	}
	for _, tt := range tests {
		err := s.Push(tt.e)
		if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: Push error %v, want %v containing %q", tt.name, err, tt.want, tt.msg)
		}
	}
	if n, _ := s.Len(); n != 1 {
		t.Errorf("bad pushes changed the queue: Len %d", n)
	}
	if got := popAll(t, s); !slices.Equal(got, []string{"q"}) {
		t.Errorf("queue after bad pushes = %v", got)
	}
}

func TestOptions(t *testing.T) {
	bad := map[string]scheduler.Option{
		"negative SLA":        scheduler.WithSLA(api.High, -time.Second),
		"huge SLA":            scheduler.WithSLA(api.High, 1000*24*time.Hour),
		"SLA of unknown tier": scheduler.WithSLA(api.Tier(9), time.Second),
		"negative max queued": scheduler.WithMaxQueued(-1),
		"negative max tokens": scheduler.WithMaxQueuedTokens(-1),
		"negative aging":      scheduler.WithAging(-time.Second),
		"promotion 1":         scheduler.WithPromotion(1),
		"promotion NaN":       scheduler.WithPromotion(math.NaN()),
		"promotion negative":  scheduler.WithPromotion(-0.1),
		"headroom 1":          scheduler.WithHeadroom(1),
		"headroom NaN":        scheduler.WithHeadroom(math.NaN()),
		"rate negative":       scheduler.WithRateLimit(-1, 1),
		"rate inf":            scheduler.WithRateLimit(math.Inf(1), 1),
		"rate NaN":            scheduler.WithRateLimit(math.NaN(), 1),
		"burst zero":          scheduler.WithRateLimit(5, 0),
		"zero clients":        scheduler.WithRateLimitClients(0),
		"nil clock":           scheduler.WithClock(nil),
	}
	for name, opt := range bad {
		if s, err := scheduler.New[int](opt); !errors.Is(err, scheduler.ErrInvalidOption) || s != nil {
			t.Errorf("%s: New = %v, %v; want ErrInvalidOption", name, s, err)
		}
	}
	s, err := scheduler.New[int](scheduler.WithSLA(api.Background, time.Minute), scheduler.WithRateLimit(0, 0),
		scheduler.WithAging(0), scheduler.WithPromotion(0), scheduler.WithMaxQueued(0), scheduler.WithMaxQueuedTokens(0))
	if err != nil || s == nil {
		t.Fatalf("valid options: %v", err)
	}
	e := &scheduler.Entry[int]{Tier: api.Background, Cost: 1}
	if err := s.Push(e); err != nil || !e.Deadline.Equal(e.Enqueued.Add(time.Minute)) {
		t.Errorf("WithSLA: deadline %v for enqueued %v (%v)", e.Deadline, e.Enqueued, err)
	}
	for _, tier := range api.Tiers() {
		e := &scheduler.Entry[int]{Tier: tier, Cost: 1}
		if err := s.Push(e); err != nil {
			t.Fatal(err)
		}
		want := scheduler.DefaultSLA(tier)
		if tier == api.Background {
			want = time.Minute
		}
		if got := e.Deadline.Sub(e.Enqueued); got != want {
			t.Errorf("%v deadline after %s, want %s", tier, got, want)
		}
	}
	if d := (&scheduler.Entry[int]{Cost: 1}); s.Push(d) != nil || d.Deadline.Sub(d.Enqueued) != 2*time.Second {
		t.Error("zero Tier is not pushed as normal")
	}
}

func TestCheckFits(t *testing.T) {
	tests := []struct {
		name                          string
		prompt, maxNew, ctxLen, kvCap int
		want                          error
		msg                           string
	}{
		{"fits", 100, 100, 4096, 10000, nil, ""},
		{"fits exactly", 4000, 96, 4096, 4096, nil, ""},
		{"unknown limits", 1 << 40, 1 << 40, 0, 0, nil, ""},
		{"empty prompt", 0, 10, 4096, 10000, engine.ErrInvalidParam, "prompt"},
		{"zero max tokens", 10, 0, 4096, 10000, engine.ErrInvalidParam, "max_tokens: 0: must be at least 1"},
		{"negative max tokens", 10, -3, 4096, 10000, engine.ErrInvalidParam, "max_tokens: -3"},
		{"over context", 4000, 200, 4096, 100000, engine.ErrContextLength, "holds 4096 tokens; the request needs 4200 (4000 prompt + 200 to generate)"},
		{"prompt alone over context", 5000, 1, 4096, 100000, engine.ErrContextLength, "4096"},
		{"huge max tokens do not overflow", 10, math.MaxInt, 4096, 100000, engine.ErrContextLength, "4096"},
		{"over KV capacity", 3000, 1000, 8192, 2048, engine.ErrOutOfMemory, `model "m" holds 2048 tokens of KV cache in all; the request needs 4000 (3000 prompt + 1000 to generate)`},
	}
	for _, tt := range tests {
		err := scheduler.CheckFits("m", tt.prompt, tt.maxNew, tt.ctxLen, tt.kvCap)
		if tt.want == nil {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: %v, want %v containing %q", tt.name, err, tt.want, tt.msg)
		}
	}
	var ce *scheduler.CapacityError
	if err := scheduler.CheckFits("m", 3000, 1000, 0, 2048); !errors.As(err, &ce) || ce.Capacity != 2048 {
		t.Errorf("CheckFits over KV = %v", err)
	}
	var cl *engine.ContextLengthError
	if err := scheduler.CheckFits("m", 3000, 1000, 2048, 0); !errors.As(err, &cl) || cl.Limit != 2048 || cl.Prompt != 3000 {
		t.Errorf("CheckFits over context = %v", err)
	}
}

func TestStatsWaits(t *testing.T) {
	clk := newClock()
	s := newSched(t, clk, scheduler.WithAging(0))
	for i := range 100 {
		mustPush(t, s, newEntry("c", api.Critical, 1))
		clk.Advance(time.Duration(i+1) * time.Millisecond)
		popName(t, s)
	}
	mustPush(t, s, newEntry("bg", api.Background, 1))
	st := s.Stats()
	c := st.Tier(api.Critical)
	if c.Waits != 100 || c.WaitP50 != 50*time.Millisecond || c.WaitP99 != 99*time.Millisecond {
		t.Errorf("critical waits %d p50 %s p99 %s; want 100, 50ms, 99ms", c.Waits, c.WaitP50, c.WaitP99)
	}
	if b := st.Tier(api.Background); b.Queued != 1 || b.Waits != 0 || st.Queued != 1 || st.QueuedTokens != 1 {
		t.Errorf("background row %+v, totals %d/%d", b, st.Queued, st.QueuedTokens)
	}
	if len(st.Tiers) != 5 || st.Tiers[0].Tier != api.Critical || st.Tier(api.Tier(9)).Tier != 0 {
		t.Errorf("Tiers rows %+v", st.Tiers)
	}
	// The reservoir keeps only the most recent waits.
	for range 2000 {
		mustPush(t, s, newEntry("c", api.Critical, 1))
		clk.Advance(time.Millisecond)
		popName(t, s)
	}
	if c := s.Stats().Tier(api.Critical); c.Waits != 1024 || c.WaitP99 != time.Millisecond {
		t.Errorf("after 2000 more pops: waits %d p99 %s; want 1024, 1ms", c.Waits, c.WaitP99)
	}
}

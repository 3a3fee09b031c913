package session

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

// clock is a settable time source.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type eviction struct {
	id     string
	reason Reason
}

func newRegistry(t *testing.T, opts ...Option) (*Registry, *clock, func() []eviction) {
	t.Helper()
	clk := &clock{now: time.Unix(1_000_000, 0)}
	var mu sync.Mutex
	var evs []eviction
	opts = append([]Option{withClock(clk.Now), WithOnEvict(func(s Session, r Reason) {
		mu.Lock()
		evs = append(evs, eviction{s.ID, r})
		mu.Unlock()
	})}, opts...)
	r, err := New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r, clk, func() []eviction {
		mu.Lock()
		defer mu.Unlock()
		out := evs
		evs = nil
		return out
	}
}

func TestBeginCreatesAndResumes(t *testing.T) {
	r, clk, _ := newRegistry(t)
	s, created, err := r.Begin("alice", "m")
	if err != nil || !created || s.Turns != 1 || s.Model != "m" || s.Worker != -1 {
		t.Fatalf("first Begin: %+v created=%v err=%v", s, created, err)
	}
	clk.Add(time.Minute)
	s, created, err = r.Begin("alice", "m")
	if err != nil || created || s.Turns != 2 || !s.LastUsed.Equal(clk.Now()) || s.Created.Equal(s.LastUsed) {
		t.Fatalf("second Begin: %+v created=%v err=%v", s, created, err)
	}
	r.SetWorker("alice", 3)
	if got, ok := r.Get("alice"); !ok || got.Worker != 3 {
		t.Fatalf("after SetWorker: %+v %v", got, ok)
	}
	if s, _, _ := r.Begin("alice", "other"); s.Model != "other" || s.Worker != -1 {
		t.Fatalf("a session moved to another model keeps its old worker: %+v", s)
	}
	st := r.Stats()
	if st.Sessions != 1 || st.Created != 1 || st.Resumed != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestBeginMintsIDs(t *testing.T) {
	r, _, _ := newRegistry(t)
	a, created, err := r.Begin("", "m")
	if err != nil || !created || len(a.ID) != 36 {
		t.Fatalf("minted %+v created=%v err=%v", a, created, err)
	}
	b, _, _ := r.Begin("", "m")
	if a.ID == b.ID {
		t.Fatalf("two minted ids are equal: %s", a.ID)
	}
	if err := ValidateID(a.ID); err != nil {
		t.Fatalf("a minted id fails validation: %v", err)
	}
}

func TestInvalidIDs(t *testing.T) {
	r, _, _ := newRegistry(t)
	for _, id := range []string{strings.Repeat("x", MaxIDLength+1), "a\nb", "tab\there", "nul\x00", "\x7f", "bad\xffutf8", "c1\u0085"} {
		_, _, err := r.Begin(id, "m")
		var ie *InvalidIDError
		if !errors.As(err, &ie) || !errors.Is(err, ErrInvalidID) || !errors.Is(err, engine.ErrInvalidParam) {
			t.Errorf("Begin(%q): %v; want an *InvalidIDError matching ErrInvalidID and engine.ErrInvalidParam", id, err)
		}
		if ie != nil && len(ie.ID) > MaxIDLength {
			t.Errorf("the error carries %d bytes of the id", len(ie.ID))
		}
	}
	for _, id := range []string{strings.Repeat("x", MaxIDLength), "user-42/chat 7", "日本語"} {
		if _, _, err := r.Begin(id, "m"); err != nil {
			t.Errorf("Begin(%q): %v", id, err)
		}
	}
	if st := r.Stats(); st.Sessions != 3 {
		t.Errorf("%d sessions after 3 valid ids", st.Sessions)
	}
}

func TestExpiryStartsFresh(t *testing.T) {
	r, clk, evs := newRegistry(t, WithTTL(time.Hour))
	r.Begin("a", "m")
	clk.Add(2 * time.Hour)
	s, created, err := r.Begin("a", "m")
	if err != nil || !created || s.Turns != 1 {
		t.Fatalf("an expired session resumed: %+v created=%v err=%v", s, created, err)
	}
	if got := evs(); len(got) != 1 || got[0] != (eviction{"a", Expired}) {
		t.Fatalf("evictions %v; want a expired", got)
	}
	if _, ok := r.Get("a"); !ok {
		t.Fatal("the fresh session is not there")
	}
	clk.Add(2 * time.Hour)
	if _, ok := r.Get("a"); ok {
		t.Fatal("Get returns an expired session")
	}
}

func TestSweepExpires(t *testing.T) {
	clk := &clock{now: time.Unix(1_000_000, 0)}
	done := make(chan string, 10)
	r, err := New(withClock(clk.Now), WithTTL(100*time.Millisecond), WithOnEvict(func(s Session, reason Reason) {
		if reason == Expired {
			done <- s.ID
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Begin("old", "m")
	clk.Add(50 * time.Millisecond)
	r.Begin("young", "m")
	clk.Add(60 * time.Millisecond)
	select {
	case id := <-done:
		if id != "old" {
			t.Fatalf("swept %q first; want old", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the sweeper never expired the old session")
	}
	if _, ok := r.Get("young"); !ok {
		t.Fatal("the sweeper removed a live session")
	}
	if st := r.Stats(); st.Expired != 1 || st.Sessions != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestMaxSessionsEvictsLRU(t *testing.T) {
	r, _, evs := newRegistry(t, WithMaxSessions(3))
	for _, id := range []string{"a", "b", "c"} {
		r.Begin(id, "m")
	}
	r.Begin("a", "m") // b is now the least recently used
	r.Begin("d", "m")
	if got := evs(); len(got) != 1 || got[0] != (eviction{"b", Evicted}) {
		t.Fatalf("evictions %v; want b evicted", got)
	}
	if r.Len() != 3 {
		t.Fatalf("%d sessions; bound is 3", r.Len())
	}
	if !r.Remove("c") || r.Remove("c") {
		t.Fatal("Remove of a live session, then again")
	}
	if got := evs(); len(got) != 1 || got[0] != (eviction{"c", Removed}) {
		t.Fatalf("evictions %v; want c removed", got)
	}
	if !r.Forget("d") {
		t.Fatal("Forget of a live session")
	}
	if got := evs(); len(got) != 0 {
		t.Fatalf("Forget called the eviction callback: %v", got)
	}
	st := r.Stats()
	if st.Evicted != 1 || st.Removed != 1 || st.Forgotten != 1 || st.Sessions != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCallbackMayCallRegistry(t *testing.T) {
	var r *Registry
	var err error
	r, err = New(WithMaxSessions(1), WithOnEvict(func(s Session, _ Reason) { r.Get(s.ID); r.Stats() }))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Begin("a", "m")
	r.Begin("b", "m") // deadlocks if the callback ran under the lock
}

func TestConcurrentBegin(t *testing.T) {
	r, _, _ := newRegistry(t, WithMaxSessions(50))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				id := fmt.Sprintf("s%d", (g*7+i)%80)
				if _, _, err := r.Begin(id, "m"); err != nil {
					t.Error(err)
					return
				}
				r.Get(id)
				r.SetWorker(id, i%4)
				if i%50 == 0 {
					r.Remove(id)
				}
			}
		}()
	}
	wg.Wait()
	st := r.Stats()
	if st.Sessions > 50 || st.Created+st.Resumed != 4000 {
		t.Fatalf("stats %+v after 4000 Begins with a bound of 50", st)
	}
}

func TestOptionsAndClose(t *testing.T) {
	for _, o := range []Option{WithTTL(-1), WithMaxSessions(0), WithOnEvict(nil)} {
		if _, err := New(o); err == nil {
			t.Error("New accepted a bad option")
		}
	}
	r, err := New(WithTTL(0))
	if err != nil {
		t.Fatal(err)
	}
	r.Begin("a", "m")
	r.Close()
	r.Close()
	if _, _, err := r.Begin("a", "m"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Begin after Close: %v", err)
	}
}

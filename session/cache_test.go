package session

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

func newSimModel(t testing.TB, opts ...enginetest.SimOption) engine.Model {
	t.Helper()
	sim, err := enginetest.NewSim(append([]enginetest.SimOption{enginetest.WithVocabSize(1000)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	m, err := sim.Load(context.Background(), engine.ModelSpec{ID: "sim"})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newCache(t testing.TB, m engine.Model, opts ...CacheOption) *PrefixCache {
	t.Helper()
	c, err := NewPrefixCache(m, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var greedy = &engine.SamplingParams{}

// turn runs one sequence: Open with key, prefill, n decode steps, Free
// saving under save. It returns the reused tokens and the generated ones.
func turn(t testing.TB, m engine.Model, id engine.SeqID, prompt []int32, key, save string, n int) (int, []int32) {
	t.Helper()
	ctx := context.Background()
	r, err := m.Open(ctx, id, prompt, key)
	if err != nil {
		t.Fatal(err)
	}
	feed := prompt[r:]
	var out []int32
	for len(out) < n {
		o, err := m.Step(ctx, []engine.StepInput{{Seq: id, Tokens: feed, Sample: true, Params: greedy}})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, o[0].Token)
		feed = out[len(out)-1:]
	}
	m.Free(id, save)
	return r, out
}

// tokens returns n pseudo-random ids below 997, a different run per seed.
func tokens(seed, n int) []int32 {
	p := make([]int32, n)
	x := uint64(seed)*0x9e3779b97f4a7c15 + 1
	for i := range p {
		x ^= x >> 30
		x *= 0xbf58476d1ce4e5b9
		x ^= x >> 27
		x += 0x94d049bb133111eb
		p[i] = int32(x % 997)
	}
	return p
}

// TestSharedPrefixWithoutSession: users without sessions whose prompts
// share a system prompt reuse it from whichever earlier user saved it, and
// get the tokens a full prefill gives.
func TestSharedPrefixWithoutSession(t *testing.T) {
	m := newSimModel(t)
	c := newCache(t, m)
	system := tokens(1, 200)
	for u := range 8 {
		prompt := append(slices.Clone(system), tokens(100+u, 10+u)...)
		r, out := turn(t, c, engine.SeqID(u+1), prompt, "", c.NewKey(), 5)
		if u > 0 && r < len(system) {
			t.Errorf("user %d reused %d tokens; the shared system prompt is %d", u, r, len(system))
		}
		if _, want := turn(t, m, engine.SeqID(100+u), prompt, "", "", 5); !slices.Equal(out, want) {
			t.Errorf("user %d: %v with reuse, %v without", u, out, want)
		}
	}
	st := c.Stats()
	if st.LookupHits != 7 || st.Hits < 7*200 || st.Keys != 8 {
		t.Fatalf("stats %+v; want 7 hits of at least 200 tokens and 8 keys", st)
	}
}

// TestSessionTemplateBoundary: a session's next turn whose prompt renders
// the last answer differently reuses up to where the tokens differ.
func TestSessionTemplateBoundary(t *testing.T) {
	c := newCache(t, newSimModel(t))
	p1 := tokens(2, 60)
	_, out := turn(t, c, 1, p1, Key("s"), Key("s"), 8)
	hist := append(slices.Clone(p1), out[:7]...)
	// The template re-renders the answer: its last token differs, then
	// an end-of-turn marker and the next user message follow.
	p2 := append(append(slices.Clone(hist[:len(hist)-1]), 999, 998), tokens(3, 20)...)
	r, _ := turn(t, c, 2, p2, Key("s"), Key("s"), 4)
	if r != len(hist)-1 {
		t.Fatalf("turn 2 reused %d tokens; the prompts share %d", r, len(hist)-1)
	}
}

// TestBudgetDropsLRU: past the token budget the least recently used saved
// entries are dropped from the index and the engine.
func TestBudgetDropsLRU(t *testing.T) {
	c := newCache(t, newSimModel(t), WithTokenBudget(250))
	for i := range 4 {
		turn(t, c, engine.SeqID(i+1), tokens(10+i, 100), "", Key(string(rune('a'+i))), 2)
	}
	st := c.Stats()
	if st.Tokens > 250 || st.Dropped != 2 || st.Keys != 2 {
		t.Fatalf("stats %+v; want at most 250 tokens, 2 dropped, 2 kept", st)
	}
	if r, _ := turn(t, c.Model(), 10, append(tokens(10, 100), 1), Key("a"), "", 1); r != 0 {
		t.Fatalf("the engine still reuses %d tokens of a dropped entry", r)
	}
	if r, _ := turn(t, c, 11, append(tokens(13, 100), 1), "", "", 1); r != 100 {
		t.Fatalf("a kept entry reused %d tokens, want 100", r)
	}
}

// TestEngineEvictionsLeaveIndex: entries the engine evicts leave the
// index and reach the lost-key callback.
func TestEngineEvictionsLeaveIndex(t *testing.T) {
	var lost []string
	c := newCache(t, newSimModel(t, enginetest.WithPrefixCacheEntries(2)), WithOnLost(func(k string) { lost = append(lost, k) }))
	for i := range 4 {
		turn(t, c, engine.SeqID(i+1), tokens(20+i, 40), "", Key(string(rune('a'+i))), 2)
	}
	if !slices.Equal(lost, []string{Key("a"), Key("b")}) {
		t.Fatalf("lost %v; want a and b", lost)
	}
	if st := c.Stats(); st.Keys != 2 || st.Evicted != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// hidden hides a model's SavedKV, like an engine that evicts silently.
type hidden struct{ engine.Model }

// TestStaleEntries: an entry the engine evicted without telling is found
// stale at its first miss and leaves the index.
func TestStaleEntries(t *testing.T) {
	c := newCache(t, hidden{newSimModel(t, enginetest.WithPrefixCacheEntries(1))})
	turn(t, c, 1, tokens(30, 40), "", "k1", 1)
	turn(t, c, 2, tokens(31, 40), "", "k2", 1) // evicts k1 silently
	if r, _ := turn(t, c, 3, append(tokens(30, 40), 5), "", "", 1); r != 0 {
		t.Fatalf("reused %d of an evicted entry", r)
	}
	if st := c.Stats(); st.Stale != 1 || st.Keys != 1 {
		t.Fatalf("stats %+v; want 1 stale, 1 key", st)
	}
}

// TestDropConcurrent: Drop and Stats from other goroutines while the loop
// runs; a dropped key is gone from the engine by the next Open.
func TestDropConcurrent(t *testing.T) {
	c := newCache(t, newSimModel(t))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				c.Drop(Key("x"))
				c.Stats()
			}
		}
	}()
	for i := range 50 {
		turn(t, c, engine.SeqID(i+1), append(tokens(40, 30), int32(i)), "", c.NewKey(), 2)
	}
	close(stop)
	wg.Wait()
	turn(t, c, 100, tokens(41, 30), "", Key("y"), 1)
	c.Drop(Key("y"))
	if r, _ := turn(t, c, 101, append(tokens(41, 30), 1), Key("y"), "", 1); r != 0 {
		// the prompt shares 30 tokens with y only
		t.Fatalf("a dropped key reused %d tokens", r)
	}
}

func TestIndexLookup(t *testing.T) {
	x := NewIndex(4)
	h := NewHasher(4)
	h.Write(tokens(1, 10))
	h.Write(tokens(1, 20)[10:]) // fed in two pieces: 5 full blocks
	if len(h.Hashes()) != 5 || h.Tokens() != 20 {
		t.Fatalf("%d hashes for 20 tokens in blocks of 4", len(h.Hashes()))
	}
	x.Insert("a", h.Hashes(), h.Tokens())
	whole := NewHasher(4)
	whole.Write(tokens(1, 20))
	if !slices.Equal(whole.Hashes(), h.Hashes()) {
		t.Fatal("hashes depend on how tokens were fed")
	}
	p := append(slices.Clone(tokens(1, 13)), 7, 7, 7)
	if k, n := x.Lookup(p); k != "a" || n != 12 {
		t.Fatalf("Lookup: %q %d; want a 12", k, n)
	}
	if n := x.Match("a", p); n != 12 {
		t.Fatalf("Match: %d", n)
	}
	p[0]++
	if k, n := x.Lookup(p); k != "" || n != 0 {
		t.Fatalf("a prompt differing in its first token found %q %d", k, n)
	}
	b := NewHasher(4)
	b.Write(tokens(1, 8))
	x.Insert("b", b.Hashes(), 8)
	if k, _ := x.Lookup(tokens(1, 8)); k != "b" {
		t.Fatalf("the entry inserted last is not preferred: %q", k)
	}
	x.Remove("b")
	if k, n := x.Lookup(tokens(1, 8)); k != "a" || n != 8 {
		t.Fatalf("after removing b: %q %d", k, n)
	}
	x.Remove("a")
	if x.Len() != 0 || x.Tokens() != 0 || len(x.nodes) != 0 {
		t.Fatalf("index not empty after removing every key: %d keys, %d tokens, %d nodes", x.Len(), x.Tokens(), len(x.nodes))
	}
}

func TestOnSaved(t *testing.T) {
	var got []string
	c := newCache(t, newSimModel(t), WithOnSaved(func(k string, w int) { got = append(got, fmt.Sprint(k, w)) }))
	turn(t, c, 1, tokens(50, 20), "", "a", 1)
	turn(t, c, 2, tokens(51, 20), "", "", 1)
	if !slices.Equal(got, []string{"a-1"}) {
		t.Fatalf("saved callbacks %v; want one for a, worker -1", got)
	}
}

// locatedModel is a model whose saved KV lives on one of several workers:
// worker 3 holds every key but "gone", which no live worker holds.
type locatedModel struct{ engine.Model }

func (locatedModel) SavedWorker(key string) int {
	if key == "gone" {
		return -1
	}
	return 3
}

var _ engine.WorkerLocator = locatedModel{}

// TestOnSavedWorker: a model that implements engine.WorkerLocator tells
// the callback which worker holds the saved KV.
func TestOnSavedWorker(t *testing.T) {
	var got []string
	c := newCache(t, locatedModel{newSimModel(t)}, WithOnSaved(func(k string, w int) { got = append(got, fmt.Sprint(k, w)) }))
	turn(t, c, 1, tokens(50, 20), "", "a", 1)
	turn(t, c, 2, tokens(51, 20), "", "gone", 1)
	if !slices.Equal(got, []string{"a3", "gone-1"}) {
		t.Fatalf("saved callbacks %v; want a on worker 3, gone on -1", got)
	}
}

func TestCacheOptions(t *testing.T) {
	m := newSimModel(t)
	for _, o := range []CacheOption{WithTokenBudget(-1), WithBlockSize(0), WithOnLost(nil), WithOnSaved(nil)} {
		if _, err := NewPrefixCache(m, o); err == nil {
			t.Error("NewPrefixCache accepted a bad option")
		}
	}
	if _, err := NewPrefixCache(nil); err == nil {
		t.Error("NewPrefixCache accepted a nil model")
	}
}

// TestCacheConformance: the wrapped model still passes the engine
// conformance suite.
func TestCacheConformance(t *testing.T) {
	sim, err := enginetest.NewSim(enginetest.WithVocabSize(500), enginetest.WithContextLength(512), enginetest.WithMaxBatch(8))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	enginetest.Run(t, cachingEngine{sim}, "")
}

type cachingEngine struct{ *enginetest.Sim }

func (e cachingEngine) Load(ctx context.Context, spec engine.ModelSpec) (engine.Model, error) {
	m, err := e.Sim.Load(ctx, spec)
	if err != nil {
		return nil, err
	}
	return NewPrefixCache(m)
}

package pyproc

import (
	"context"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

// saveOn opens seq with prompt (reusing key's prefix), prefills it, frees
// it saving its KV under key, and returns the reuse Open reported and the
// worker it ran on.
func saveOn(t *testing.T, m *Model, seq engine.SeqID, p []int32, key string) (int, *proc) {
	t.Helper()
	return reuseSave(t, m, seq, p, key, key)
}

// reuseSave is saveOn with different keys for Open and Free.
func reuseSave(t *testing.T, m *Model, seq engine.SeqID, p []int32, from, key string) (int, *proc) {
	t.Helper()
	ctx := context.Background()
	r, err := m.Open(ctx, seq, p, from)
	if err != nil {
		t.Fatal(err)
	}
	where := m.seqs[seq].proc
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: seq, Tokens: p[r:], Sample: true, Params: greedy}}); err != nil {
		t.Fatal(err)
	}
	m.Free(seq, key)
	return r, where
}

// TestPrefixAffinity: a sequence naming a saved prefix goes to the worker
// holding it, and reuses it, while that worker's load is within bound; an
// overloaded holder sends it to the least-loaded worker instead.
func TestPrefixAffinity(t *testing.T) {
	e := newEngine(t, WithWorkers(2))
	m := load(t, e, tiny(t))
	ctx := context.Background()
	base := prompt(3, 40)
	_, holder := saveOn(t, m, 1, base, "k")
	for i := range 4 {
		p := append(slices.Clone(base[:30]), prompt(10+i, 5)...)
		r, where := reuseSave(t, m, engine.SeqID(10+i), p, "k", "")
		if where != holder || r != 30 {
			t.Fatalf("sequence %d: ran on another worker or reused %d, want the holder and 30", i, r)
		}
	}
	// Load the holder with open sequences until it is over the bound.
	var open []engine.SeqID
	defer func() {
		for _, id := range open {
			m.Free(id, "")
		}
	}()
	for i := range 3 {
		id := engine.SeqID(100 + i)
		if _, err := m.Open(ctx, id, prompt(20+i, 8), "k"); err != nil {
			t.Fatal(err)
		}
		open = append(open, id)
	}
	st := m.Affinity()
	if st.Overloaded == 0 || st.Hits < 5 {
		t.Fatalf("affinity %+v: want at least 5 hits and some overloaded fallbacks", st)
	}
	id := engine.SeqID(200)
	if _, err := m.Open(ctx, id, base, "k"); err != nil {
		t.Fatal(err)
	}
	open = append(open, id)
	ws := e.Workers()
	if d := ws[0].Sequences - ws[1].Sequences; d > 2 || d < -2 {
		t.Fatalf("workers carry %d and %d sequences: affinity ignored the load bound", ws[0].Sequences, ws[1].Sequences)
	}
}

// TestSavedEvictionsReported: KV the worker evicts for memory, and KV on a
// worker that died, is reported by EvictedSaved; DropSaved removes a key.
func TestSavedEvictionsReported(t *testing.T) {
	e := newEngine(t, WithWorkers(1), withFaults())
	m, err := e.Load(context.Background(), engine.ModelSpec{ID: "tiny", Path: tiny(t), MaxBatch: 2, KVCapacity: 512})
	if err != nil {
		t.Fatal(err)
	}
	pm := m.(*Model)
	// A pool of 32 blocks of 16 tokens. Six saves of 10 tokens hold a
	// block each, which still count as free; a sequence that needs 28
	// blocks makes the worker evict the two oldest.
	for i := range 6 {
		saveOn(t, pm, engine.SeqID(i+1), prompt(i, 10), string(rune('a'+i)))
	}
	if n := pm.FreeBlocks(); n != 32 {
		t.Fatalf("FreeBlocks %d with six saved prefixes; want all 32 (saved blocks are evictable)", n)
	}
	if ev := pm.EvictedSaved(); len(ev) != 0 {
		t.Fatalf("EvictedSaved %v before the pool ran short", ev)
	}
	saveOn(t, pm, 10, prompt(9, 28*16), "")
	ev := pm.EvictedSaved()
	if !slices.Equal(ev, []string{"a", "b"}) {
		t.Fatalf("EvictedSaved %v after a sequence took 28 of 32 blocks; want the oldest two, a and b", ev)
	}
	if st := pm.Affinity(); st.Saved+len(ev) != 6 {
		t.Fatalf("%d keys held and %d evicted; want 6 in all", st.Saved, len(ev))
	}
	pm.DropSaved("f")
	if r, _ := saveOn(t, pm, 20, append(prompt(5, 10), 1, 2), "f"); r != 0 {
		t.Fatalf("a dropped key reused %d tokens", r)
	}
	if r, _ := saveOn(t, pm, 21, append(prompt(5, 10), 1, 2, 3), "f"); r != 12 {
		t.Fatalf("a key saved again reused %d tokens, want 12", r)
	}
	p, err := e.slots[0].current(context.Background(), e.closing)
	if err != nil {
		t.Fatal(err)
	}
	_ = syscall.Kill(p.pid(), syscall.SIGKILL)
	deadline := time.Now().Add(10 * time.Second)
	for p.alive() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	ev = pm.EvictedSaved()
	if !slices.Contains(ev, "f") {
		t.Fatalf("after the worker died EvictedSaved reports %v; want every key it held, f among them", ev)
	}
	if st := pm.Affinity(); st.Saved != 0 {
		t.Fatalf("%d keys still held after the only worker died", st.Saved)
	}
	r, _ := saveOn(t, pm, 30, append(prompt(5, 10), 1, 2, 3, 4), "f")
	if r != 0 {
		t.Fatalf("the replacement worker reused %d tokens of KV that died with its predecessor", r)
	}
}

// twoSmallPools loads the tiny model on two workers of 16 KV blocks each.
func twoSmallPools(t *testing.T) *Model {
	t.Helper()
	e := newEngine(t, WithWorkers(2))
	m, err := e.Load(context.Background(), engine.ModelSpec{ID: "tiny", Path: tiny(t), MaxBatch: 8, KVCapacity: 512})
	if err != nil {
		t.Fatal(err)
	}
	return m.(*Model)
}

// openOn opens sequence id with prompt p and returns the worker it went to.
func openOn(t *testing.T, m *Model, id engine.SeqID, p []int32) *proc {
	t.Helper()
	if _, err := m.Open(context.Background(), id, p, ""); err != nil {
		t.Fatal(err)
	}
	return m.seqs[id].proc
}

// TestRoutesToRoom: a new sequence goes to a worker whose pool has the
// blocks for its prompt, even where another has fewer open sequences:
// the batcher admits by the pools' sum, so a worker without them would
// refuse its steps while the other has room.
func TestRoutesToRoom(t *testing.T) {
	m := twoSmallPools(t)
	ctx := context.Background()
	open := func(id engine.SeqID, p []int32) *proc {
		t.Helper()
		w := openOn(t, m, id, p)
		if _, err := m.Step(ctx, []engine.StepInput{{Seq: id, Tokens: p, Sample: true, Params: greedy}}); err != nil {
			t.Fatal(err)
		}
		return w
	}
	per := m.blocksPer[0]
	// A long sequence fills most of one worker's pool; short ones then
	// leave that worker with fewer open sequences than the other.
	full := open(1, prompt(1, (per-3)*16))
	other := open(2, prompt(2, 8))
	if other == full {
		t.Fatalf("the second sequence joined the first's worker")
	}
	if open(3, prompt(3, 8)) != full || open(4, prompt(4, 8)) != other {
		t.Fatalf("short sequences were not spread by open sequences")
	}
	m.Free(3, "") // the full worker: 1 open; the other: 2
	// Ten blocks' prompt: fewest open sequences says the full worker,
	// which has two or three blocks free; room says the other.
	if got := open(6, prompt(6, 10*16)); got != other {
		t.Fatalf("a 10-block prompt went to the worker with %d free blocks (of %d), not to the one with room", m.poolOf(full).free, per)
	}
	for _, id := range []engine.SeqID{1, 2, 4, 6} {
		m.Free(id, "")
	}
}

// TestRoutesByOwedBlocks: sequences opened before any of them is fed
// (one admission round) count the blocks their prompts will take, which
// the workers' reports do not show yet: a second long prompt goes to the
// other worker, though the first one's worker has fewer open sequences,
// and both run.
func TestRoutesByOwedBlocks(t *testing.T) {
	m := twoSmallPools(t)
	ctx := context.Background()
	open := func(id engine.SeqID, p []int32) *proc { t.Helper(); return openOn(t, m, id, p) }
	// Two short sequences on each worker, then both of the first's go:
	// the first worker has none open, the second two.
	first, second := open(1, prompt(1, 8)), open(2, prompt(2, 8))
	if open(3, prompt(3, 8)) != first || open(4, prompt(4, 8)) != second || first == second {
		t.Fatalf("short sequences were not spread by open sequences")
	}
	m.Free(1, "")
	m.Free(3, "")
	long := (m.blocksPer[0] - 4) * 16
	a, b := prompt(10, long), prompt(11, long)
	if got := open(10, a); got != first {
		t.Fatalf("the first long prompt went to the worker with more open sequences")
	}
	if got := open(11, b); got != second {
		t.Fatalf("the second long prompt went to the worker the first one's unfed prompt fills (%d free, %d owed)",
			m.poolOf(first).free, m.poolOf(first).owed)
	}
	in := []engine.StepInput{
		{Seq: 10, Tokens: a, Sample: true, Params: greedy},
		{Seq: 11, Tokens: b, Sample: true, Params: greedy},
	}
	if _, err := m.Step(ctx, in); err != nil {
		t.Fatalf("both long prompts in one step: %v", err)
	}
	if o := m.poolOf(first).owed + m.poolOf(second).owed; o != 2 {
		t.Fatalf("%d blocks owed after the long prompts were fed; want the two unfed short ones' (1 each)", o)
	}
	for _, id := range []engine.SeqID{2, 4, 10, 11} {
		m.Free(id, "")
	}
	if o := m.poolOf(first).owed + m.poolOf(second).owed; o != 0 {
		t.Fatalf("%d blocks owed with no sequence open", o)
	}
}

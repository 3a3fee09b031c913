//go:build mlx

package mlx

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// TestPoolRowsGiveWay fills a small KV pool with a saved prefix: a new
// sequence that needs its rows evicts it (and says so), prefix reuse
// shares rows instead of copying them, and every row comes back when the
// sequences are freed.
func TestPoolRowsGiveWay(t *testing.T) {
	e := newEngine(t)
	dir := tinyDir(t, nil)
	mi, err := e.Load(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir, KVCapacity: 32})
	if err != nil {
		t.Fatal(err)
	}
	m := mi.(*model)
	ctx := context.Background()
	seq := func(first int32, n int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = first + int32(i)
		}
		return p
	}
	step := func(id engine.SeqID, toks []int32) {
		t.Helper()
		if _, err := m.Step(ctx, []engine.StepInput{{Seq: id, Tokens: toks, Sample: true}}); err != nil {
			t.Fatal(err)
		}
	}
	free := func() int {
		var n int
		_ = m.call(func(*graph) error { n = m.pool.freeRows(); return nil })
		return n
	}
	a := seq(10, 20)
	if _, err := m.Open(ctx, 1, a, ""); err != nil {
		t.Fatal(err)
	}
	step(1, a)
	m.Free(1, "a")
	if got := free(); got != 12 {
		t.Fatalf("%d free rows with a 20-token prefix saved, want 12", got)
	}
	// Reuse shares the saved rows: 19 shared, one new.
	if r, err := m.Open(ctx, 2, a, "a"); err != nil || r != 19 {
		t.Fatalf("reuse %d, %v; want 19", r, err)
	}
	step(2, a[19:])
	if got := free(); got != 11 {
		t.Fatalf("%d free rows after reusing 19 of 20 saved rows, want 11", got)
	}
	m.Free(2, "")
	b := seq(100, 20)
	if _, err := m.Open(ctx, 3, b, ""); err != nil {
		t.Fatal(err)
	}
	step(3, b) // 20 rows; 12 free: the saved prefix gives way
	if ev := m.EvictedSaved(); !slices.Equal(ev, []string{"a"}) {
		t.Fatalf("evicted %v, want [a]", ev)
	}
	m.Free(3, "")
	if got := free(); got != 32 {
		t.Fatalf("%d free rows after freeing everything, want 32", got)
	}
}

// TestPoolTooLarge: a KV capacity beyond MLX's memory limit is refused at
// load with ErrOutOfMemory, before anything is allocated.
func TestPoolTooLarge(t *testing.T) {
	e := newEngine(t)
	_, err := e.Load(context.Background(), engine.ModelSpec{ID: "tiny", Path: tinyDir(t, nil), KVCapacity: 1 << 50})
	if !errors.Is(err, engine.ErrOutOfMemory) {
		t.Fatalf("Load with a KV capacity of 2^50 tokens: %v, want ErrOutOfMemory", err)
	}
}

// TestGroupedPrefill: prompts of the same length prefilled whole in one
// step attend as one group and give the tokens they give alone.
func TestGroupedPrefill(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tinyDir(t, nil))
	ctx := context.Background()
	ps := [][]int32{{1, 72, 101, 108, 108, 111}, {1, 200, 17, 33, 5, 9}, {1, 5, 9, 300, 301, 302}}
	batch := make([]engine.StepInput, len(ps))
	for i, p := range ps {
		id := engine.SeqID(10 + i)
		if _, err := m.Open(ctx, id, p, ""); err != nil {
			t.Fatal(err)
		}
		defer m.Free(id, "")
		batch[i] = engine.StepInput{Seq: id, Tokens: p, Sample: true}
	}
	_ = m.call(func(g *graph) error {
		fs, _, _ := m.feeds(batch, make([]*engine.SamplingParams, len(batch)))
		if err := m.rowsFor(fs); err != nil {
			return err
		}
		if pl := m.plan(g, fs); len(pl.pre) != 1 || len(pl.pre[0].feeds) != 3 {
			t.Errorf("plan groups %d prefill feeds as %d groups, want 1", len(fs), len(pl.pre))
		}
		for _, f := range fs {
			m.pool.drop(f.seq, 0)
		}
		return nil
	})
	batched := make([][]int32, len(ps))
	for range 6 {
		out, err := m.Step(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range out {
			batched[i] = append(batched[i], o.Token)
			batch[i].Tokens = []int32{o.Token}
		}
	}
	for i, p := range ps {
		alone, _ := generate(t, m, engine.SeqID(100+i), p, 6, len(p), nil)
		if !slices.Equal(alone, batched[i]) {
			t.Errorf("prompt %d: grouped %v, alone %v", i, batched[i], alone)
		}
	}
}

//go:build mlx

package mlx

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// pooled loads the tiny checkpoint with a pool of rows tokens.
func pooled(t *testing.T, e *Engine, rows int) *model {
	t.Helper()
	return pooledDir(t, e, tinyDir(t, nil), rows)
}

// pooledDir loads the checkpoint in dir with a pool of rows tokens.
func pooledDir(t *testing.T, e *Engine, dir string, rows int) *model {
	t.Helper()
	m, err := e.Load(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir, KVCapacity: rows, MaxBatch: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m.(*model)
}

// tokens returns n prompt tokens from first on.
func tokens(first int32, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = first + int32(i)
	}
	return p
}

// feedOne steps seq with toks, sampling greedily when sample is set, and
// returns the sampled token.
func feedOne(m *model, seq engine.SeqID, toks []int32, sample bool) (int32, error) {
	out, err := m.Step(context.Background(), []engine.StepInput{{Seq: seq, Tokens: toks, Sample: sample}})
	if err != nil || !sample {
		return 0, err
	}
	return out[0].Token, nil
}

// wantFree fails t unless FreeBlocks is want.
func wantFree(t *testing.T, m *model, want int, when string) {
	t.Helper()
	if got := m.FreeBlocks(); got != want {
		t.Fatalf("%s: FreeBlocks %d, want %d", when, got, want)
	}
}

// freeRows is the pool's rows nobody holds, saved prefixes included.
func freeRows(m *model) int {
	n := 0
	_ = m.call(func(*graph) error { n = m.pool.freeRows(); return nil })
	return n
}

// TestBlockAccounting follows engine.BlockPool's rules with blocks of one
// row: Open of a new prompt takes nothing, feeding n tokens takes n
// blocks, a saved prefix's rows count as free, Open with reuse takes
// BlocksFor(reused) once however many sequences share them, and Free
// returns every block no other sequence holds.
func TestBlockAccounting(t *testing.T) {
	m := pooled(t, newEngine(t), 64)
	info := m.Info()
	if !info.Paged() || info.BlockSize != 1 || info.KVBlocks != 64 || info.KVCapacity != 64 {
		t.Fatalf("Info: block size %d, %d blocks, capacity %d; want 64 blocks of 1", info.BlockSize, info.KVBlocks, info.KVCapacity)
	}
	if info.ContextLength != 64 {
		t.Fatalf("ContextLength %d with a 64-token pool; want it capped at 64", info.ContextLength)
	}
	wantFree(t, m, 64, "new model")
	ctx := context.Background()
	p := tokens(10, 20)
	if r, err := m.Open(ctx, 1, p, ""); err != nil || r != 0 {
		t.Fatalf("Open: %d, %v", r, err)
	}
	wantFree(t, m, 64, "after Open of a new prompt")
	fed := 0
	for _, n := range []int{7, 13} {
		if _, err := feedOne(m, 1, p[fed:fed+n], fed+n == len(p)); err != nil {
			t.Fatal(err)
		}
		fed += n
		wantFree(t, m, 64-info.BlocksFor(fed), "after a prompt chunk")
	}
	all := slices.Clone(p)
	tok := int32(3)
	for range 5 {
		if _, err := feedOne(m, 1, []int32{tok}, true); err != nil {
			t.Fatal(err)
		}
		all = append(all, tok)
		wantFree(t, m, 64-info.BlocksFor(len(all)), "after a decode step")
	}
	m.Free(1, "a")
	wantFree(t, m, 64, "with a 25-token prefix saved")
	if n := freeRows(m); n != 64-25 {
		t.Fatalf("%d rows on the free list, want %d: the saved prefix keeps its rows", n, 64-25)
	}
	turn := append(slices.Clone(all), 200, 201, 202)
	for id := engine.SeqID(2); id <= 3; id++ {
		if r, err := m.Open(ctx, id, turn, "a"); err != nil || r != len(all) {
			t.Fatalf("Open %d with key a: reused %d, %v; want %d", id, r, err, len(all))
		}
		wantFree(t, m, 64-info.BlocksFor(len(all)), "with the saved rows shared by reuse")
	}
	if _, err := feedOne(m, 2, turn[len(all):], true); err != nil {
		t.Fatal(err)
	}
	wantFree(t, m, 64-len(turn), "after sequence 2 fed its own tokens")
	m.Free(2, "")
	wantFree(t, m, 64-len(all), "after Free of 2: the rows 3 shares stay held")
	m.Free(3, "")
	wantFree(t, m, 64, "after every sequence was freed")
	if ev := m.EvictedSaved(); len(ev) != 0 {
		t.Fatalf("evicted %v with the pool never short", ev)
	}
}

// TestSavedPrefixesGiveWay: saved prefixes are evicted least recently used
// first when a step needs their rows, and an evicted prefix whose rows a
// live sequence shares returns only the rows nobody else holds.
func TestSavedPrefixesGiveWay(t *testing.T) {
	m := pooled(t, newEngine(t), 32)
	a, b := tokens(10, 20), tokens(100, 10)
	for i, p := range [][]int32{a, b} {
		id := engine.SeqID(i + 1)
		if _, err := m.Open(context.Background(), id, p, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := feedOne(m, id, p, true); err != nil {
			t.Fatal(err)
		}
	}
	m.Free(1, "a")
	m.Free(2, "b")
	wantFree(t, m, 32, "with two saved prefixes")
	if n := freeRows(m); n != 2 {
		t.Fatalf("%d rows on the free list, want 2", n)
	}
	c := tokens(150, 12)
	if _, err := m.Open(context.Background(), 3, c, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := feedOne(m, 3, c, true); err != nil {
		t.Fatal(err)
	}
	if ev := m.EvictedSaved(); !slices.Equal(ev, []string{"a"}) {
		t.Fatalf("a 12-token step with 2 rows free evicted %v, want the older prefix [a]", ev)
	}
	wantFree(t, m, 20, "after the 12-token step")
	// Sequence 4 shares 9 of b's 10 rows.
	if r, err := m.Open(context.Background(), 4, b, "b"); err != nil || r != 9 {
		t.Fatalf("reuse of b: %d, %v; want 9", r, err)
	}
	wantFree(t, m, 11, "with 9 of b's rows shared")
	if n := freeRows(m); n != 10 {
		t.Fatalf("%d rows on the free list, want 10", n)
	}
	if _, err := feedOne(m, 3, tokens(170, 11), false); err != nil {
		t.Fatalf("a step needing the 11 free blocks: %v", err)
	}
	if ev := m.EvictedSaved(); !slices.Equal(ev, []string{"b"}) {
		t.Fatalf("evicted %v, want [b]", ev)
	}
	wantFree(t, m, 0, "with the pool full")
	if _, err := feedOne(m, 4, b[9:], true); !errors.Is(err, engine.ErrOutOfMemory) {
		t.Fatalf("a step with no block free: %v, want ErrOutOfMemory", err)
	}
	m.Free(3, "")
	if _, err := feedOne(m, 4, b[9:], true); err != nil {
		t.Fatalf("the reused rows outlive the evicted prefix: %v", err)
	}
	m.Free(4, "")
	wantFree(t, m, 32, "after every sequence was freed")
	if n := freeRows(m); n != 32 {
		t.Fatalf("%d rows on the free list after everything was freed, want 32", n)
	}
}

// TestOutOfBlocksChangesNothing: a step needing more blocks than
// FreeBlocks fails with ErrOutOfMemory before taking a row or evicting a
// saved prefix; every sequence of the refused batch goes on to the tokens
// it gets alone.
func TestOutOfBlocksChangesNothing(t *testing.T) {
	e := newEngine(t)
	m := pooled(t, e, 48)
	ctx := context.Background()
	saved, p2, p3 := tokens(10, 20), tokens(60, 25), tokens(120, 24)
	if _, err := m.Open(ctx, 1, saved, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := feedOne(m, 1, saved, false); err != nil {
		t.Fatal(err)
	}
	m.Free(1, "kept")
	for id, p := range map[engine.SeqID][]int32{2: p2, 3: p3} {
		if _, err := m.Open(ctx, id, p, ""); err != nil {
			t.Fatal(err)
		}
	}
	tok, err := feedOne(m, 2, p2, true)
	if err != nil {
		t.Fatal(err)
	}
	wantFree(t, m, 23, "after a 25-token prompt")
	batch := []engine.StepInput{{Seq: 2, Tokens: []int32{tok}, Sample: true}, {Seq: 3, Tokens: p3, Sample: true}}
	if _, err := m.Step(ctx, batch); !errors.Is(err, engine.ErrOutOfMemory) {
		t.Fatalf("a step needing 25 blocks with 23 free: %v, want ErrOutOfMemory", err)
	}
	wantFree(t, m, 23, "after the refused step")
	if n := freeRows(m); n != 3 {
		t.Fatalf("%d rows on the free list after the refused step, want 3", n)
	}
	if ev := m.EvictedSaved(); len(ev) != 0 {
		t.Fatalf("the refused step evicted %v", ev)
	}
	got2 := []int32{tok}
	for len(got2) < 6 { // sequence 2 goes on alone, evicting the saved prefix
		if tok, err = feedOne(m, 2, []int32{tok}, true); err != nil {
			t.Fatal(err)
		}
		got2 = append(got2, tok)
	}
	m.Free(2, "")
	out, err := m.Step(ctx, []engine.StepInput{{Seq: 3, Tokens: p3, Sample: true}})
	if err != nil {
		t.Fatalf("the refused prompt after a Free: %v", err)
	}
	m.Free(3, "")
	wantFree(t, m, 48, "after every sequence was freed")
	ref := pooled(t, e, 48)
	if want, _ := generate(t, ref, 1, p2, 6, len(p2), nil); !slices.Equal(got2, want) {
		t.Errorf("sequence 2 after the refused step: %v, alone %v", got2, want)
	}
	if want, _ := generate(t, ref, 2, p3, 1, len(p3), nil); out[0].Token != want[0] {
		t.Errorf("sequence 3 after the refused step sampled %d, alone %d", out[0].Token, want[0])
	}
}

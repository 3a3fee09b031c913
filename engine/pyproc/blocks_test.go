package pyproc

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

// loadPool loads the tiny model on one worker with a pool of blocks
// blocks of 16 tokens.
func loadPool(t *testing.T, e *Engine, blocks int) *Model {
	t.Helper()
	m, err := e.Load(context.Background(), engine.ModelSpec{ID: "tiny", Path: tiny(t), KVCapacity: 16 * blocks})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m.(*Model)
}

// step feeds tokens to seq and returns the sampled token (sample set) or
// the error.
func stepSeq(m *Model, seq engine.SeqID, toks []int32, sample bool) (int32, error) {
	outs, err := m.Step(context.Background(), []engine.StepInput{{Seq: seq, Tokens: toks, Sample: sample, Params: greedy}})
	if err != nil || !sample {
		return 0, err
	}
	return outs[0].Token, nil
}

// TestFreeBlocksAccounting follows engine.BlockPool's accounting through
// a sequence's life: Open of a new prompt takes nothing, feeding n tokens
// to a sequence of f takes BlocksFor(f+n)-BlocksFor(f), Free gives them
// back (as cached blocks, still counted free).
func TestFreeBlocksAccounting(t *testing.T) {
	// No blocks taken ahead: not for tokens decoded ahead (lookahead), nor
	// for the speculated next step (CUDA), which takes each sampling
	// sequence's next block and would shift the count by a token.
	m := loadPool(t, newEngine(t, WithLookahead(1), WithTuning(Tuning{NoOverlap: true})), 64)
	info := m.Info()
	if !info.Paged() || info.BlockSize != 16 || info.KVBlocks != 64 {
		t.Fatalf("Info %+v: want 64 blocks of 16 tokens", info)
	}
	if n := m.FreeBlocks(); n != 64 {
		t.Fatalf("FreeBlocks %d on a new model, want 64", n)
	}
	p := prompt(1, 40)
	if r := len(p) - len(openFeed(t, m, 1, p)); r != 0 || m.FreeBlocks() != 64 {
		t.Fatalf("open reused %d and left %d free; want 0 and 64", r, m.FreeBlocks())
	}
	tok, err := stepSeq(m, 1, p, true)
	if err != nil {
		t.Fatal(err)
	}
	fed := len(p)
	for fed < 60 {
		before := m.FreeBlocks()
		if tok, err = stepSeq(m, 1, []int32{tok}, true); err != nil {
			t.Fatal(err)
		}
		fed++
		if want := before - (info.BlocksFor(fed) - info.BlocksFor(fed-1)); m.FreeBlocks() != want {
			t.Fatalf("after feeding token %d: %d free, want %d", fed, m.FreeBlocks(), want)
		}
	}
	if n := m.FreeBlocks(); n != 64-info.BlocksFor(60) {
		t.Fatalf("a 60-token sequence leaves %d free, want %d", n, 64-info.BlocksFor(60))
	}
	m.Free(1, "")
	if n := m.FreeBlocks(); n != 64 {
		t.Fatalf("FreeBlocks %d after Free, want 64", n)
	}
}

// TestOutOfBlocks: a step whose blocks exceed FreeBlocks fails with
// engine.ErrOutOfMemory and changes no sequence: after another sequence
// is freed the same step runs and gives the tokens the sequence gets
// alone.
func TestOutOfBlocks(t *testing.T) {
	e := newEngine(t)
	m := loadPool(t, e, 32)
	pa, pb := prompt(1, 300), prompt(2, 220)            // 19 and 14 of 32 blocks
	want := generate(t, loadPool(t, e, 32), 100, pb, 4) // another pool: nothing cached in m
	feedA, feedB := openFeed(t, m, 1, pa), openFeed(t, m, 2, pb)
	if _, err := stepSeq(m, 1, feedA, false); err != nil {
		t.Fatal(err)
	}
	free := m.FreeBlocks()
	if _, err := stepSeq(m, 2, feedB, true); !errors.Is(err, engine.ErrOutOfMemory) {
		t.Fatalf("a step needing %d blocks with %d free: %v, want ErrOutOfMemory", m.Info().BlocksFor(len(feedB)), free, err)
	}
	if m.FreeBlocks() != free {
		t.Fatalf("the refused step changed FreeBlocks from %d to %d", free, m.FreeBlocks())
	}
	m.Free(1, "")
	var got []int32
	feed := feedB
	for len(got) < 4 {
		tok, err := stepSeq(m, 2, feed, true)
		if err != nil {
			t.Fatal(err)
		}
		got, feed = append(got, tok), []int32{tok}
	}
	m.Free(2, "")
	if !slices.Equal(got, want) {
		t.Fatalf("after a refused step: %v, alone %v", got, want)
	}
}

// TestPrefixBlocksShared: sequences with the same prompt share its full
// blocks (one copy in the pool, as n > 1 choices do), a later Open of a
// prompt that extends it reuses them without a key, and the tokens equal
// a full prefill's.
func TestPrefixBlocksShared(t *testing.T) {
	// Without the speculated next step (CUDA), which takes each sampling
	// sequence's next block ahead and would blur the count.
	e := newEngine(t, WithTuning(Tuning{NoOverlap: true}))
	p := prompt(3, 48)
	ext := append(slices.Clone(p), prompt(4, 7)...)
	wantExt := generate(t, loadPool(t, e, 64), 100, ext, 5)
	m2 := loadPool(t, e, 64) // a pool of its own: no cached blocks
	for id := engine.SeqID(1); id <= 2; id++ {
		if f := openFeed(t, m2, id, p); len(f) != len(p) {
			t.Fatalf("a fresh pool reused %d tokens", len(p)-len(f))
		}
	}
	outs, err := m2.Step(context.Background(), []engine.StepInput{
		{Seq: 1, Tokens: p, Sample: true, Params: greedy}, {Seq: 2, Tokens: p, Sample: true, Params: greedy}})
	if err != nil {
		t.Fatal(err)
	}
	if outs[0].Token != outs[1].Token {
		t.Fatalf("the same prompt sampled %d and %d", outs[0].Token, outs[1].Token)
	}
	if n := m2.FreeBlocks(); n != 64-3 {
		t.Fatalf("two 48-token prompts left %d blocks free, want 61: their 3 blocks shared", n)
	}
	m2.Free(1, "")
	m2.Free(2, "")
	feed := openFeed(t, m2, 3, ext)
	if r := len(ext) - len(feed); r != 48 {
		t.Fatalf("a prompt extending a cached one reused %d tokens, want 48", r)
	}
	var got []int32
	for len(got) < 5 {
		tok, err := stepSeq(m2, 3, feed, true)
		if err != nil {
			t.Fatal(err)
		}
		got, feed = append(got, tok), []int32{tok}
	}
	m2.Free(3, "")
	if !slices.Equal(got, wantExt) {
		t.Fatalf("with 48 cached tokens reused: %v, full prefill %v", got, wantExt)
	}
}

// TestCancelledStepFreesBlocks: a step cancelled while the worker runs
// it returns ctx.Err(); freeing its sequence gives every block back.
func TestCancelledStepFreesBlocks(t *testing.T) {
	e := newEngine(t, withFaults())
	m := loadPool(t, e, 64)
	p, err := e.slots[0].current(context.Background(), e.closing)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.call(context.Background(), "tiny", request("fault", map[string]any{"kind": "step_delay", "seconds": 0.3})); err != nil {
		t.Fatal(err)
	}
	feed := openFeed(t, m, 1, prompt(5, 100))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: feed, Sample: true, Params: greedy}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled step: %v", err)
	}
	m.Free(1, "")
	if n := m.FreeBlocks(); n != 64 {
		t.Fatalf("FreeBlocks %d after the cancelled sequence was freed, want 64", n)
	}
}

// TestPagedRandom runs testdata/paged_test.py: thousands of random opens,
// feeds, frees with and without a key, drops and evictions on the block
// pool, checked against its invariants (no block leaked, none owned twice,
// exact reference counts) and against the KV each sequence reads back
// through its block table.
func TestPagedRandom(t *testing.T) {
	runPyCheck(t, "testdata/paged_test.py", "runtime", "3000", "1")
}

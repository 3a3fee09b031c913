package enginetest

import (
	"errors"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// checkBlocks checks a paged model's block contract (engine.Info.BlockSize,
// engine.BlockPool) on the small model: its pool is whole when nothing is
// open; Open of a prompt nothing was cached for takes no block; feeding
// takes exactly the blocks the new tokens start; a step needing more
// blocks than are free fails with engine.ErrOutOfMemory and changes no
// sequence, then runs once a Free gave blocks back, with the tokens the
// sequence gets alone; freeing every sequence makes the pool whole again.
func checkBlocks(tb testing.TB, s *suite) {
	info := s.small.Info()
	pool, ok := s.small.(engine.BlockPool)
	switch {
	case !ok:
		tb.Fatalf("Info.BlockSize %d, but the model does not implement engine.BlockPool", info.BlockSize)
	case info.KVCapacity != info.KVBlocks/info.Groups()*info.BlockSize:
		tb.Errorf("KVCapacity %d, want KVBlocks/Groups*BlockSize = %d", info.KVCapacity, info.KVBlocks/info.Groups()*info.BlockSize)
	case info.BlocksFor(info.ContextLength) > info.KVBlocks:
		tb.Errorf("ContextLength %d exceeds the pool's %d tokens: a sequence could outgrow the pool alone", info.ContextLength, info.KVCapacity)
	}
	if info.KVBlocks < 3 || info.ContextLength < info.BlockSize+2 {
		tb.Skipf("the small model's pool (%d blocks of %d, context %d) is too small for the check", info.KVBlocks, info.BlockSize, info.ContextLength)
	}
	free := pool.FreeBlocks()
	if free != info.KVBlocks {
		tb.Fatalf("FreeBlocks %d with no sequence open; want the whole pool, %d", free, info.KVBlocks)
	}
	var open []engine.SeqID
	defer func() {
		for _, id := range open {
			s.small.Free(id, "")
		}
	}()
	// feed feeds toks to id without sampling and checks what it took.
	feed := func(id engine.SeqID, fed int, toks []int32) bool {
		tb.Helper()
		before := pool.FreeBlocks()
		if _, err := s.small.Step(s.ctx, []engine.StepInput{{Seq: id, Tokens: toks}}); err != nil {
			tb.Errorf("feeding %d tokens to a sequence of %d with %d blocks free: %v", len(toks), fed, before, err)
			return false
		}
		want := before - (info.BlocksFor(fed+len(toks)) - info.BlocksFor(fed))
		if got := pool.FreeBlocks(); got != want {
			tb.Errorf("feeding %d tokens to a sequence of %d: FreeBlocks %d -> %d, want %d", len(toks), fed, before, got, want)
			return false
		}
		return true
	}
	openFresh := func(seed, n int) (engine.SeqID, []int32) {
		tb.Helper()
		id, p := s.id(), promptTokens(seed, n, info.VocabSize)
		before := pool.FreeBlocks()
		reused, err := s.small.Open(s.ctx, id, p, "")
		if err != nil {
			tb.Fatalf("open of a %d-token prompt with %d blocks free: %v", n, before, err)
		}
		open = append(open, id)
		if reused != 0 || pool.FreeBlocks() != before {
			tb.Fatalf("Open of a new prompt reused %d tokens and took %d blocks; want 0 and 0", reused, before-pool.FreeBlocks())
		}
		return id, p
	}

	// A: the whole context, fed in chunks that start, fill and cross blocks.
	a, pa := openFresh(7101, info.ContextLength)
	bs := info.BlockSize
	chunks := []int{bs/2 + 1, bs, bs/2 + 1, 1}
	for fed, i, n := 0, 0, 0; fed < len(pa); fed, i = fed+n, i+1 {
		n = min(len(pa)-fed, chunks[i%len(chunks)])
		if !feed(a, fed, pa[fed:fed+n]) {
			return
		}
	}
	// B takes what is left but one block (at least one).
	rest := pool.FreeBlocks()
	b, pb := openFresh(7102, max(1, min(info.ContextLength, info.TokensFor(0, rest-1))))
	if !feed(b, 0, pb) {
		return
	}
	// C needs more than is free.
	left := pool.FreeBlocks()
	if info.TokensFor(0, left) >= info.ContextLength {
		tb.Logf("a sequence of the whole context takes %d blocks, %d are free: no step to refuse", info.BlocksFor(info.ContextLength), left)
		return
	}
	c, pc := openFresh(7103, info.TokensFor(0, left)+1)
	greedy := &engine.SamplingParams{}
	_, err := s.small.Step(s.ctx, []engine.StepInput{{Seq: c, Tokens: pc, Sample: true, Params: greedy}})
	if !errors.Is(err, engine.ErrOutOfMemory) {
		tb.Fatalf("a step needing %d blocks with %d free: %v; want engine.ErrOutOfMemory", info.BlocksFor(len(pc)), left, err)
	}
	if got := pool.FreeBlocks(); got != left {
		tb.Fatalf("the refused step changed FreeBlocks from %d to %d", left, got)
	}
	s.small.Free(a, "")
	open = slices.DeleteFunc(open, func(id engine.SeqID) bool { return id == a })
	if got := pool.FreeBlocks(); got < left+info.BlocksFor(len(pa)) {
		tb.Fatalf("freeing a %d-token sequence left %d blocks free, want at least %d", len(pa), got, left+info.BlocksFor(len(pa)))
	}
	outs, err := s.small.Step(s.ctx, []engine.StepInput{{Seq: c, Tokens: pc, Sample: true, Params: greedy}})
	if err != nil {
		tb.Fatalf("the refused step again after a Free: %v", err)
	}
	for _, id := range open {
		s.small.Free(id, "")
	}
	open = nil
	if got := pool.FreeBlocks(); got != info.KVBlocks {
		tb.Errorf("FreeBlocks %d after every sequence was freed; want %d", got, info.KVBlocks)
	}
	if want := s.alone(tb, s.small, pc, 1, nil); len(outs) != 1 || outs[0].Token != want[0] {
		tb.Errorf("after a refused step the sequence sampled %v; alone it samples %v", outs, want)
	}
}

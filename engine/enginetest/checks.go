package enginetest

import (
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// checkDeterminism: the same prompt twice gives the same greedy tokens.
func checkDeterminism(tb testing.TB, s *suite) {
	for seed := range 3 {
		p := s.prompt(seed, 10)
		a := s.alone(tb, s.m, p, 16, nil)
		b := s.alone(tb, s.m, p, 16, nil)
		if !slices.Equal(a, b) {
			tb.Errorf("prompt %d: first run %v, second run %v", seed, a, b)
		}
	}
	if a, b := s.alone(tb, s.m, s.prompt(10, 10), 8, nil), s.alone(tb, s.m, s.prompt(11, 10), 8, nil); slices.Equal(a, b) {
		tb.Logf("two different prompts gave the same tokens %v (allowed, but unusual)", a)
	}
}

// checkBatchInvariance: sequences of different prompt lengths stepped
// together get exactly the tokens each gets alone.
func checkBatchInvariance(tb testing.TB, s *suite) {
	var plans []*plan
	for i, n := range []int{5, 11, 17, 29} {
		plans = append(plans, &plan{id: s.id(), prompt: s.prompt(20+i, n), n: 10})
	}
	s.run(tb, s.m, plans...)
	s.sameAsAlone(tb, "batched", plans...)
}

// checkJoinLeave: sequences that open and finish at different steps, so
// the batch changes under them, get their lone tokens.
func checkJoinLeave(tb testing.TB, s *suite) {
	shape := []struct{ len, n, start int }{{3, 8, 0}, {9, 12, 0}, {17, 6, 2}, {5, 16, 5}, {12, 10, 9}}
	var plans []*plan
	for i, sh := range shape {
		plans = append(plans, &plan{id: s.id(), prompt: s.prompt(30+i, sh.len), n: sh.n, start: sh.start})
	}
	s.run(tb, s.m, plans...)
	s.sameAsAlone(tb, "joining and leaving", plans...)
}

// checkChunkedPrefill: a prompt fed in chunks of 1, 3 and 7 tokens, alone
// and all three together, gives the tokens of the prompt fed whole.
func checkChunkedPrefill(tb testing.TB, s *suite) {
	p := s.prompt(40, 23)
	want := s.alone(tb, s.m, p, 8, nil)
	var together []*plan
	for _, chunk := range []int{1, 3, 7} {
		alone := &plan{id: s.id(), prompt: p, n: 8, chunk: chunk}
		s.run(tb, s.m, alone)
		if !slices.Equal(alone.out, want) {
			tb.Errorf("chunks of %d: %v; fed whole: %v", chunk, alone.out, want)
		}
		together = append(together, &plan{id: s.id(), prompt: p, n: 8, chunk: chunk})
	}
	s.run(tb, s.m, together...)
	for _, pl := range together {
		if !slices.Equal(pl.out, want) {
			tb.Errorf("chunks of %d batched with other chunkings: %v; fed whole: %v", pl.chunk, pl.out, want)
		}
	}
}

// checkFreeReuse: a freed id opens again and behaves as new; Free twice
// and Free of an unknown id are no-ops.
func checkFreeReuse(tb testing.TB, s *suite) {
	id := s.id()
	p, q := s.prompt(50, 9), s.prompt(51, 14)
	first := &plan{id: id, prompt: p, n: 8}
	s.run(tb, s.m, first)
	s.m.Free(id, "")
	s.m.Free(id, "")
	s.m.Free(engine.SeqID(1<<62+12345), "")
	again := &plan{id: id, prompt: p, n: 8}
	s.run(tb, s.m, again)
	if !slices.Equal(again.out, first.out) {
		tb.Errorf("id %d reopened with the same prompt: %v; first time %v", id, again.out, first.out)
	}
	other := &plan{id: id, prompt: q, n: 8}
	s.run(tb, s.m, other)
	s.sameAsAlone(tb, "reused id with a new prompt", other)
}

// history is what a finished plan's sequence was fed: its prompt and
// every generated token but the last.
func (p *plan) history() []int32 {
	return append(slices.Clone(p.prompt), p.out[:len(p.out)-1]...)
}

// checkPrefixReuse: KV saved by Free under a key is reused by an Open of a
// longer prompt it starts, never for the whole prompt, never for a prompt
// it does not start, and the tokens equal a full prefill's.
func checkPrefixReuse(tb testing.TB, s *suite) {
	first := &plan{id: s.id(), prompt: s.prompt(60, 12), n: 6, save: "conformance-turn-1"}
	s.run(tb, s.m, first)
	hist := first.history()
	next := &plan{id: s.id(), prompt: append(slices.Clone(hist), s.prompt(61, 5)...), n: 6, key: first.save}
	s.run(tb, s.m, next)
	if next.reused <= 0 || next.reused > len(hist) {
		tb.Errorf("a %d-token prompt that starts with the %d tokens saved under its key reused %d; want 1 to %d",
			len(next.prompt), len(hist), next.reused, len(hist))
	}
	s.sameAsAlone(tb, "with a reused prefix", next)

	whole := &plan{id: s.id(), prompt: s.prompt(62, 10), n: 6, save: "conformance-whole"}
	s.run(tb, s.m, whole)
	same := &plan{id: s.id(), prompt: whole.history(), n: 6, key: whole.save}
	s.run(tb, s.m, same) // drive refuses reuse of the whole prompt
	s.sameAsAlone(tb, "a prompt equal to the saved tokens", same)

	other := &plan{id: s.id(), prompt: s.prompt(63, 10), n: 4, save: "conformance-other"}
	s.run(tb, s.m, other)
	diverged := append(other.history(), s.prompt(64, 4)...)
	diverged[0] = (diverged[0] + 1) % int32(min(s.info.VocabSize, 200))
	for _, c := range []*plan{
		{id: s.id(), prompt: diverged, n: 6, key: other.save},
		{id: s.id(), prompt: s.prompt(65, 10), n: 6, key: "conformance-never-saved"},
	} {
		s.run(tb, s.m, c)
		if c.reused != 0 {
			tb.Errorf("key %q whose tokens do not start the prompt reused %d tokens; want 0", c.key, c.reused)
		}
		s.sameAsAlone(tb, "with a key that does not match", c)
	}
}

// checkSeededSampling: temperature sampling with the same seed repeats,
// alone and batched with other seeded sequences; different seeds differ on
// at least one of several prompts.
func checkSeededSampling(tb testing.TB, s *suite) {
	seeded := func(seed uint64) *engine.SamplingParams {
		return &engine.SamplingParams{Temperature: 1, Seed: seed, HasSeed: true}
	}
	differ := false
	var batched []*plan
	for i := range 4 {
		p := s.prompt(70+i, 8+i)
		a := s.alone(tb, s.m, p, 12, seeded(7))
		b := s.alone(tb, s.m, p, 12, seeded(7))
		if !slices.Equal(a, b) {
			tb.Errorf("prompt %d, seed 7 twice: %v then %v", i, a, b)
		}
		if c := s.alone(tb, s.m, p, 12, seeded(8)); !slices.Equal(a, c) {
			differ = true
		}
		batched = append(batched, &plan{id: s.id(), prompt: p, n: 12, params: seeded(7)})
	}
	if !differ {
		tb.Error("seeds 7 and 8 gave the same tokens on every prompt: the seed is ignored")
	}
	s.run(tb, s.m, batched...)
	s.sameAsAlone(tb, "seeded, batched", batched...)
}

// checkPartialPrefixReuse: an Open whose prompt shares only part of the
// tokens saved under its key reuses exactly their longest common prefix —
// the case of a chat template that renders the previous answer differently
// from the tokens generated — and the tokens equal a full prefill's. The
// saved entry stays whole for later Opens. Models that implement
// engine.SavedKV forget a dropped key; models that implement
// engine.WorkerLocator name a worker for a saved key and none for a key
// never saved or dropped.
func checkPartialPrefixReuse(tb testing.TB, s *suite) {
	first := &plan{id: s.id(), prompt: s.prompt(90, 14), n: 8, save: "conformance-partial"}
	s.run(tb, s.m, first)
	hist := first.history() // 21 tokens
	span := int32(min(s.info.VocabSize, 200))
	for _, c := range []struct {
		what   string
		prompt []int32
		want   int
	}{
		{"diverging after 16 tokens", append(append(slices.Clone(hist[:16]), (hist[16]+1)%span), s.prompt(91, 6)...), 16},
		{"diverging after 5 tokens", append(append(slices.Clone(hist[:5]), (hist[5]+1)%span), s.prompt(92, 9)...), 5},
		{"shorter than the saved tokens", slices.Clone(hist[:11]), 10},
		{"extending the saved tokens", append(slices.Clone(hist), s.prompt(93, 4)...), len(hist)},
	} {
		p := &plan{id: s.id(), prompt: c.prompt, n: 6, key: first.save}
		s.run(tb, s.m, p)
		if p.reused != c.want {
			tb.Errorf("%s: a %d-token prompt sharing %d tokens with the %d saved under its key reused %d; want %d",
				c.what, len(c.prompt), c.want, len(hist), p.reused, c.want)
		}
		s.sameAsAlone(tb, "partial prefix reuse, "+c.what, p)
	}
	wl, locates := s.m.(engine.WorkerLocator)
	if locates && (wl.SavedWorker(first.save) < 0 || wl.SavedWorker("conformance-never-saved") != -1) {
		tb.Errorf("SavedWorker: %d for a saved key, %d for a key never saved; want a worker and -1",
			wl.SavedWorker(first.save), wl.SavedWorker("conformance-never-saved"))
	}
	sk, ok := s.m.(engine.SavedKV)
	if !ok {
		return
	}
	sk.DropSaved(first.save)
	sk.DropSaved("conformance-never-saved")
	if locates && wl.SavedWorker(first.save) != -1 {
		tb.Errorf("SavedWorker names worker %d for a key dropped with DropSaved", wl.SavedWorker(first.save))
	}
	p := &plan{id: s.id(), prompt: append(slices.Clone(hist), s.prompt(94, 3)...), n: 4, key: first.save}
	s.run(tb, s.m, p)
	if p.reused != 0 {
		tb.Errorf("a key dropped with DropSaved still reused %d tokens", p.reused)
	}
	if ev := sk.EvictedSaved(); slices.Contains(ev, first.save) {
		tb.Errorf("EvictedSaved reports %q, which the caller dropped itself: %v", first.save, ev)
	}
}

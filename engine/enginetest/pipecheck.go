package enginetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

// RunPipeline runs the conformance suite of [engine.Pipeliner] against
// eng, loading the checkpoint in dir as [Run] does (the model as the
// checkpoint comes and a small one), in named subtests:
//
//   - same_tokens: a script of steps with sequences joining mid-way with
//     chunked prompts, greedy, seeded, penalised, with log-probabilities,
//     two freed while a row of theirs is pending, gives the same tokens
//     and log-probabilities run with Step and explicit tokens as run with
//     StepAsync of each step before the Wait of the one before, Prev rows
//     and OpenAsync;
//   - free_pending: Free of a sequence in the pending step; the step still
//     returns its output, and FreeBlocks after the Wait has its blocks;
//   - prev_refused: Prev in a Step, with no step pending, of a sequence
//     that does not sample in the pending step, with tokens or without
//     Sample is an *engine.InvalidParamError, from StepAsync or from the
//     Wait, and changes nothing;
//   - not_run: a step sent behind a step that fails (a paged model's
//     engine.ErrOutOfMemory, induced on the small model) fails with
//     engine.ErrNotRun and changes nothing;
//   - free_blocks_pending: FreeBlocks returns while a step is pending,
//     also after a Free of one of its sequences (paged models);
//   - open_async: OpenAsync with and without a step pending, its Wait
//     before and after the step's, a Free before its Wait, and a prefix
//     reused through it;
//   - opening_chunk: a first prompt chunk marked Opening sent behind its
//     OpenAsync — within the prefix the open reuses, past it, the whole
//     prompt, and for an open that reuses nothing — gives the tokens of a
//     synchronous Open and Step of the rest, and stepping on gives the
//     same tokens; Opening in a Step, or of a sequence stepped since its
//     open, is refused (skipped for a model that reuses no saved prefix).
//
// A model that does not implement engine.Pipeliner skips the suite, and
// a check whose StepAsync or OpenAsync declines (ok false) skips: an
// engine that declines small batches runs it with that turned off. The
// checks' batches hold at most 5 inputs (2 on the small model), their
// prompts and generations tens of tokens, so a tiny model runs the suite
// in seconds. RunPipeline closes the models it loaded but not eng.
func RunPipeline(t *testing.T, eng engine.Engine, dir string) {
	t.Helper()
	notPipeliner := func(s *suite) string {
		if _, ok := s.m.(engine.Pipeliner); !ok {
			return fmt.Sprintf("model %q (%T) does not implement engine.Pipeliner", mainID, s.m)
		}
		return ""
	}
	runChecks(t, eng, dir, notPipeliner, []namedCheck{
		{"same_tokens", checkPipelineSameTokens},
		{"free_pending", checkPipelineFree},
		{"prev_refused", checkPipelinePrev},
		{"not_run", checkPipelineNotRun},
		{"free_blocks_pending", checkPipelineFreeBlocks},
		{"open_async", checkPipelineOpen},
		{"opening_chunk", checkPipelineOpening},
	})
}

// pipeliner returns m as an engine.Pipeliner, skipping tb if it is not.
func pipeliner(tb testing.TB, m engine.Model) engine.Pipeliner {
	tb.Helper()
	pl, ok := m.(engine.Pipeliner)
	if !ok {
		tb.Skipf("model %q does not implement engine.Pipeliner", m.Info().ID)
	}
	return pl
}

// pipe runs a check's steps on one model, failing tb on unexpected
// errors. close, deferred, waits for the steps still pending and frees
// the sequences the check opened, so a failed or skipped check leaves the
// model idle.
type pipe struct {
	tb     testing.TB
	s      *suite
	m      engine.Model
	pl     engine.Pipeliner
	sent   []engine.PendingStep // not waited for yet
	opened []engine.SeqID
}

func newPipe(tb testing.TB, s *suite, m engine.Model) *pipe {
	tb.Helper()
	return &pipe{tb: tb, s: s, m: m, pl: pipeliner(tb, m)}
}

func (p *pipe) close() {
	for _, ps := range p.sent {
		_, _ = ps.Wait(p.s.ctx)
	}
	for _, id := range p.opened {
		p.m.Free(id, "")
	}
}

// open opens a sequence for prompt with Open.
func (p *pipe) open(prompt []int32) engine.SeqID {
	p.tb.Helper()
	id := p.s.id()
	if _, err := p.m.Open(p.s.ctx, id, prompt, ""); err != nil {
		p.tb.Fatalf("open of a %d-token prompt: %v", len(prompt), err)
	}
	p.opened = append(p.opened, id)
	return id
}

// openAsync sends the open of sequence id, skipping tb when OpenAsync
// declines.
func (p *pipe) openAsync(id engine.SeqID, prompt []int32, key string) engine.PendingOpen {
	p.tb.Helper()
	po, ok := p.pl.OpenAsync(p.s.ctx, id, prompt, key)
	if !ok {
		p.tb.Skipf("OpenAsync declined a %d-token prompt", len(prompt))
	}
	p.opened = append(p.opened, id)
	return po
}

// waitOpen waits for an open, failing tb unless it reused want tokens.
func (p *pipe) waitOpen(po engine.PendingOpen, want int, what string) {
	p.tb.Helper()
	if reused, err := po.Wait(p.s.ctx); err != nil || reused != want {
		p.tb.Fatalf("%s: Wait of the open: reused %d, %v; want %d, nil", what, reused, err, want)
	}
}

// step runs batch with Step.
func (p *pipe) step(batch []engine.StepInput) []engine.StepOutput {
	p.tb.Helper()
	outs, err := p.m.Step(p.s.ctx, batch)
	if err != nil {
		p.tb.Fatalf("Step of %d inputs: %v", len(batch), err)
	}
	return outs
}

// send sends batch with StepAsync, skipping tb when it declines.
func (p *pipe) send(batch []engine.StepInput) engine.PendingStep {
	p.tb.Helper()
	ps, ok, err := p.pl.StepAsync(p.s.ctx, batch)
	switch {
	case err != nil:
		p.tb.Fatalf("StepAsync of %d inputs with %d steps pending: %v", len(batch), len(p.sent), err)
	case !ok:
		p.tb.Skipf("StepAsync declined a batch of %d inputs: the model runs such batches synchronously", len(batch))
	}
	p.sent = append(p.sent, ps)
	return ps
}

// waitErr waits for a step sent by send.
func (p *pipe) waitErr(ps engine.PendingStep) ([]engine.StepOutput, error) {
	p.sent = slices.DeleteFunc(p.sent, func(q engine.PendingStep) bool { return q == ps })
	return ps.Wait(p.s.ctx)
}

// wait waits for a step sent by send, failing tb on an error.
func (p *pipe) wait(ps engine.PendingStep, what string) []engine.StepOutput {
	p.tb.Helper()
	outs, err := p.waitErr(ps)
	if err != nil {
		p.tb.Fatalf("%s: Wait: %v", what, err)
	}
	return outs
}

// expect fails tb unless outs hold exactly the tokens want, for the
// sequences of ids, in order.
func (p *pipe) expect(what string, outs []engine.StepOutput, ids []engine.SeqID, want ...int32) {
	p.tb.Helper()
	ok := len(outs) == len(want)
	for i := 0; ok && i < len(outs); i++ {
		ok = outs[i].Seq == ids[i] && outs[i].Token == want[i]
	}
	if !ok {
		p.tb.Errorf("%s: outputs %v of sequences %v; want tokens %v of sequences %v (as each gets alone)", what, outs, seqsOf(outs), want, ids)
	}
}

func seqsOf(outs []engine.StepOutput) []engine.SeqID {
	ids := make([]engine.SeqID, len(outs))
	for i, o := range outs {
		ids[i] = o.Seq
	}
	return ids
}

// Inputs the checks build: feed tokens and sample greedily, feed them
// without sampling, feed the pending step's sample.
func sampleIn(id engine.SeqID, toks ...int32) engine.StepInput {
	return engine.StepInput{Seq: id, Tokens: toks, Sample: true, Params: &engine.SamplingParams{}}
}

func feedIn(id engine.SeqID, toks ...int32) engine.StepInput {
	return engine.StepInput{Seq: id, Tokens: toks}
}

func prevIn(id engine.SeqID) engine.StepInput {
	return engine.StepInput{Seq: id, Prev: true, Sample: true, Params: &engine.SamplingParams{}}
}

// pool returns m's engine.BlockPool when m is paged, skipping tb when it
// is not.
func pagedPool(tb testing.TB, m engine.Model) engine.BlockPool {
	tb.Helper()
	pool, ok := m.(engine.BlockPool)
	if !ok || !m.Info().Paged() {
		tb.Skipf("model %q is not paged", m.Info().ID)
	}
	return pool
}

// checkPipelineFree: a sequence freed while the step that feeds it and
// samples for it is pending — as a caller does when the step before
// showed it finished — still gets that step's output, its blocks come
// back once the step is waited for, and the other sequence of the step
// goes on with its lone tokens.
func checkPipelineFree(tb testing.TB, s *suite) {
	p := newPipe(tb, s, s.m)
	defer p.close()
	pa, pb := s.prompt(510, 6), s.prompt(511, 9)
	wantA, wantB := s.alone(tb, s.m, pa, 2, nil), s.alone(tb, s.m, pb, 3, nil)
	pool, paged := s.m.(engine.BlockPool)
	paged = paged && s.info.Paged()
	before := 0
	if paged {
		before = pool.FreeBlocks()
	}
	a, b := p.open(pa), p.open(pb)
	ab := []engine.SeqID{a, b}
	n := p.send([]engine.StepInput{sampleIn(a, pa...), sampleIn(b, pb...)})
	n1 := p.send([]engine.StepInput{prevIn(a), prevIn(b)})
	p.expect("step N", p.wait(n, "step N"), ab, wantA[0], wantB[0])
	s.m.Free(a, "")
	p.expect("step N+1, one of whose sequences was freed while it was pending",
		p.wait(n1, "step N+1 after a Free of one of its sequences"), ab, wantA[1], wantB[1])
	if want := before - s.info.BlocksFor(len(pb)+1); paged && pool.FreeBlocks() != want {
		tb.Errorf("FreeBlocks %d after the Wait of the step a freed sequence was in; want %d (%d before, the other sequence holds %d tokens)",
			pool.FreeBlocks(), want, before, len(pb)+1)
	}
	p.expect("the step after", p.wait(p.send([]engine.StepInput{sampleIn(b, wantB[1])}), "the step after"), ab[1:], wantB[2])
	s.m.Free(b, "")
	if paged && pool.FreeBlocks() != before {
		tb.Errorf("FreeBlocks %d once both sequences were freed; want %d", pool.FreeBlocks(), before)
	}
}

// checkPipelinePrev: a Prev input is refused with an
// *engine.InvalidParamError — in a Step, in a StepAsync with no step
// pending, of a sequence whose pending row fed a prompt chunk without
// sampling, of a sequence never fed, with tokens, without Sample — and
// the refusal changes nothing: the pending step's output is right and
// every sequence goes on with its lone tokens.
func checkPipelinePrev(tb testing.TB, s *suite) {
	p := newPipe(tb, s, s.m)
	defer p.close()
	px, py, pz := s.prompt(520, 10), s.prompt(521, 6), s.prompt(522, 5)
	wantX, wantY, wantZ := s.alone(tb, s.m, px, 2, nil), s.alone(tb, s.m, py, 6, nil), s.alone(tb, s.m, pz, 2, nil)
	x, y, z := p.open(px), p.open(py), p.open(pz)
	p.expect("a synchronous step", p.step([]engine.StepInput{feedIn(x, px[:5]...), sampleIn(y, py...)}), []engine.SeqID{y}, wantY[0])
	if _, err := s.m.Step(s.ctx, []engine.StepInput{prevIn(y)}); !isInvalid(err) {
		tb.Errorf("a Step with a Prev input: %v; want an *engine.InvalidParamError", err)
	}
	p.refused(nil, []engine.StepInput{prevIn(y)}, "Prev with no step pending")
	withTokens, noSample := prevIn(y), prevIn(y)
	withTokens.Tokens, noSample.Sample = wantY[0:1], false
	for k, c := range []struct {
		what string
		bad  engine.StepInput
	}{
		{"Prev of a sequence whose pending row is a prompt chunk that does not sample", prevIn(x)},
		{"Prev of a sequence opened and never fed", prevIn(z)},
		{"Prev with tokens", withTokens},
		{"Prev without Sample", noSample},
	} {
		batch := []engine.StepInput{sampleIn(y, wantY[k])}
		if k == 0 {
			batch = append(batch, feedIn(x, px[5:8]...))
		}
		outs := p.refused(p.send(batch), []engine.StepInput{c.bad}, c.what)
		p.expect("the step pending while "+c.what+" was refused", outs, []engine.SeqID{y}, wantY[k+1])
	}
	outs := p.step([]engine.StepInput{sampleIn(x, px[8:]...), sampleIn(y, wantY[4]), sampleIn(z, pz...)})
	p.expect("after the refusals", outs, []engine.SeqID{x, y, z}, wantX[0], wantY[5], wantZ[0])
	outs = p.step([]engine.StepInput{sampleIn(x, wantX[0]), sampleIn(z, wantZ[0])})
	p.expect("after the refusals, a step on", outs, []engine.SeqID{x, z}, wantX[1], wantZ[1])
}

// refused sends bad behind pend (nil: no step pending) and fails tb
// unless it is refused with an *engine.InvalidParamError, from StepAsync
// or from its Wait. It returns pend's outputs.
func (p *pipe) refused(pend engine.PendingStep, bad []engine.StepInput, what string) []engine.StepOutput {
	p.tb.Helper()
	q, ok, err := p.pl.StepAsync(p.s.ctx, bad)
	if err == nil && !ok {
		p.tb.Skipf("%s: StepAsync declined a batch of %d inputs", what, len(bad))
	}
	if err == nil {
		p.sent = append(p.sent, q)
	}
	var outs []engine.StepOutput
	if pend != nil {
		outs = p.wait(pend, "the step pending while "+what+" was sent")
	}
	if err == nil {
		if _, err = p.waitErr(q); err == nil {
			p.tb.Fatalf("%s: the step ran", what)
		}
	}
	if !isInvalid(err) {
		p.tb.Errorf("%s: %v; want an *engine.InvalidParamError", what, err)
	}
	return outs
}

func isInvalid(err error) bool {
	var ipe *engine.InvalidParamError
	return errors.As(err, &ipe)
}

// checkPipelineNotRun: on the small model, paged, a step needing more
// blocks than are free fails at its Wait with engine.ErrOutOfMemory, and
// the step sent behind it, with a Prev row of a sequence the failed step
// was to sample, fails with engine.ErrNotRun; neither changed anything:
// FreeBlocks is as before, the sequence goes on with its lone tokens and
// pipelined steps run again.
func checkPipelineNotRun(tb testing.TB, s *suite) {
	m := s.small
	pool := pagedPool(tb, m)
	info := m.Info()
	p := newPipe(tb, s, m)
	defer p.close()
	px := promptTokens(530, 3, info.VocabSize)
	wantX := s.alone(tb, m, px, 3, nil)
	x := p.open(px)
	p.expect("the first step", p.step([]engine.StepInput{sampleIn(x, px...)}), []engine.SeqID{x}, wantX[0])
	for k := 0; pool.FreeBlocks() >= info.BlocksFor(info.ContextLength); k++ {
		pf := promptTokens(531+k, info.ContextLength, info.VocabSize)
		id := p.open(pf)
		if _, err := m.Step(s.ctx, []engine.StepInput{feedIn(id, pf...)}); errors.Is(err, engine.ErrOutOfMemory) {
			m.Free(id, "")
			break
		} else if err != nil {
			tb.Fatalf("filling the pool: a step of %d tokens: %v", len(pf), err)
		}
	}
	free := pool.FreeBlocks()
	if info.TokensFor(0, free) >= info.ContextLength {
		tb.Skipf("%d blocks of %d tokens free hold the context of %d: no step to refuse", free, info.BlockSize, info.ContextLength)
	}
	pc := promptTokens(540, info.TokensFor(0, free)+1, info.VocabSize)
	c := p.open(pc)
	f := p.send([]engine.StepInput{sampleIn(x, wantX[0]), sampleIn(c, pc...)})
	g := p.send([]engine.StepInput{prevIn(x)})
	if _, err := p.waitErr(f); !errors.Is(err, engine.ErrOutOfMemory) {
		tb.Fatalf("a step needing %d blocks with %d free: %v; want engine.ErrOutOfMemory", info.BlocksFor(len(pc)), free, err)
	}
	if _, err := p.waitErr(g); !errors.Is(err, engine.ErrNotRun) {
		tb.Fatalf("the step sent behind a step that failed: %v; want engine.ErrNotRun", err)
	}
	if got := pool.FreeBlocks(); got != free {
		tb.Errorf("FreeBlocks %d after the failed step and the one not run; before them %d", got, free)
	}
	h := p.send([]engine.StepInput{sampleIn(x, wantX[0])})
	h1 := p.send([]engine.StepInput{prevIn(x)})
	p.expect("the step after a step not run", p.wait(h, "the step after"), []engine.SeqID{x}, wantX[1])
	p.expect("the step behind it", p.wait(h1, "the step behind it"), []engine.SeqID{x}, wantX[2])
}

// checkPipelineFreeBlocks: FreeBlocks does not wait for a pending step,
// also after a Free of one of its sequences: it returns in less than
// half the time a synchronous step of the same batch takes (checked when
// that is 20 ms or more), and once the step is waited for it counts the
// blocks of the sequences it fed and not those of the freed one.
func checkPipelineFreeBlocks(tb testing.TB, s *suite) {
	pool := pagedPool(tb, s.m)
	p := newPipe(tb, s, s.m)
	defer p.close()
	// 255-token prompts: the sequences sample, and an engine may give a
	// sampling sequence the block of its next token ahead (pyproc's
	// speculated decode step on CUDA, PROTOCOL.md "KV blocks"); token 256
	// stays in the prompt's last block for block sizes dividing 256.
	k, plen := min(s.info.MaxBatch, 4), min(s.info.ContextLength, 256)-1
	batch := func(seed int) []engine.StepInput {
		var b []engine.StepInput
		for i := range k {
			pr := s.prompt(seed+i, plen)
			b = append(b, sampleIn(p.open(pr), pr...))
		}
		return b
	}
	b := batch(550)
	start := time.Now()
	p.step(b)
	took := time.Since(start)
	for _, in := range b {
		s.m.Free(in.Seq, "")
	}
	b = batch(560)
	before := pool.FreeBlocks()
	n := p.send(b)
	start = time.Now()
	pool.FreeBlocks()
	first := time.Since(start)
	s.m.Free(b[0].Seq, "")
	start = time.Now()
	pool.FreeBlocks()
	second := time.Since(start)
	if outs := p.wait(n, "the step"); len(outs) != k {
		tb.Errorf("%d outputs for %d sampling inputs, one of whose sequences was freed while the step was pending", len(outs), k)
	}
	if want := before - (k-1)*s.info.BlocksFor(plen); pool.FreeBlocks() != want {
		tb.Errorf("FreeBlocks %d after the step; want %d (%d before, %d sequences of %d tokens)", pool.FreeBlocks(), want, before, k-1, plen)
	}
	if took < 20*time.Millisecond {
		tb.Logf("a step of %d x %d tokens takes %v: too quick to tell whether FreeBlocks (%v, %v) waits for it", k, plen, took, first, second)
		return
	}
	if first > took/2 || second > took/2 {
		tb.Errorf("FreeBlocks took %v, and %v after a Free, while a step of %v was pending: it waits for the step", first, second, took)
	}
}

// checkPipelineOpen: a sequence opened with OpenAsync — with no step
// pending, or while one is, its Wait after the step's or before it —
// steps with its lone tokens; a sequence freed before its open's Wait
// leaves the open's result as Open's and its id free to open again; and
// OpenAsync reuses a prefix saved under its key as Open does.
func checkPipelineOpen(tb testing.TB, s *suite) {
	if s.info.MaxBatch < 3 {
		tb.Skipf("the check steps 3 sequences at once; MaxBatch is %d", s.info.MaxBatch)
	}
	p := newPipe(tb, s, s.m)
	defer p.close()
	pa, pb, pc, pd, py := s.prompt(570, 7), s.prompt(571, 5), s.prompt(572, 11), s.prompt(573, 6), s.prompt(574, 8)
	wantA, wantB, wantC, wantD, wantY := s.alone(tb, s.m, pa, 1, nil), s.alone(tb, s.m, pb, 3, nil),
		s.alone(tb, s.m, pc, 2, nil), s.alone(tb, s.m, pd, 1, nil), s.alone(tb, s.m, py, 4, nil)
	a := s.id()
	p.waitOpen(p.openAsync(a, pa, ""), 0, "OpenAsync with no step pending")
	p.expect("a sequence opened with OpenAsync", p.wait(p.send([]engine.StepInput{sampleIn(a, pa...)}), "its step"), []engine.SeqID{a}, wantA[0])
	s.m.Free(a, "")

	y, b, c := p.open(py), s.id(), s.id()
	n := p.send([]engine.StepInput{sampleIn(y, py...)})
	ob := p.openAsync(b, pb, "")
	p.expect("the step pending while an open was sent", p.wait(n, "the step"), []engine.SeqID{y}, wantY[0])
	p.waitOpen(ob, 0, "OpenAsync while a step was pending, waited for after the step")
	n = p.send([]engine.StepInput{sampleIn(y, wantY[0]), sampleIn(b, pb...)})
	p.waitOpen(p.openAsync(c, pc, ""), 0, "OpenAsync while a step was pending, waited for before the step")
	p.expect("the step a sequence opened with OpenAsync joined", p.wait(n, "the step"), []engine.SeqID{y, b}, wantY[1], wantB[0])
	ybc := []engine.SeqID{y, b, c}
	n = p.send([]engine.StepInput{sampleIn(y, wantY[1]), sampleIn(b, wantB[0]), sampleIn(c, pc...)})

	d := s.id()
	od := p.openAsync(d, pd, "")
	s.m.Free(d, "")
	n1 := p.send([]engine.StepInput{prevIn(y), prevIn(b), prevIn(c)})
	p.expect("the step pending while a sequence was opened and freed", p.wait(n, "the step"), ybc, wantY[2], wantB[1], wantC[0])
	p.waitOpen(od, 0, "OpenAsync of a sequence freed before the Wait")
	p.expect("the step sent behind the open and Free", p.wait(n1, "the step"), ybc, wantY[3], wantB[2], wantC[1])
	p.waitOpen(p.openAsync(d, pd, ""), 0, "OpenAsync of the id of a sequence freed before its open's Wait")
	p.expect("a sequence opened again", p.wait(p.send([]engine.StepInput{sampleIn(d, pd...)}), "its step"), []engine.SeqID{d}, wantD[0])
	for _, id := range []engine.SeqID{y, b, c, d} {
		s.m.Free(id, "")
	}

	first := &plan{id: s.id(), prompt: s.prompt(575, 10), n: 5, save: "conformance-pipeline-open"}
	s.run(tb, s.m, first)
	hist := first.history()
	pe := append(slices.Clone(hist), s.prompt(576, 4)...)
	e := s.id()
	oe := p.openAsync(e, pe, first.save)
	reused, err := oe.Wait(s.ctx)
	switch {
	case err != nil:
		tb.Fatalf("OpenAsync with a prefix key: %v", err)
	case reused < 1 || reused > len(hist):
		tb.Fatalf("OpenAsync of a %d-token prompt starting with the %d tokens saved under its key reused %d; want 1 to %d", len(pe), len(hist), reused, len(hist))
	}
	want := s.alone(tb, s.m, pe, 1, nil)
	p.expect("a sequence opened with a reused prefix", p.wait(p.send([]engine.StepInput{sampleIn(e, pe[reused:]...)}), "its step"), []engine.SeqID{e}, want[0])
}

package enginetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

// newPipeliner returns a simulated model that pipelines, and its Sim.
func newPipeliner(t *testing.T, opts ...SimOption) (*Sim, engine.Model, engine.Pipeliner) {
	t.Helper()
	sim, m := newModel(t, opts...)
	pl, ok := m.(engine.Pipeliner)
	if !ok {
		t.Fatalf("the simulated model %T is not an engine.Pipeliner", m)
	}
	return sim, m, pl
}

// sendOK sends batch with StepAsync, failing t unless it is sent.
func sendOK(t *testing.T, pl engine.Pipeliner, batch ...engine.StepInput) engine.PendingStep {
	t.Helper()
	p, ok, err := pl.StepAsync(context.Background(), batch)
	if err != nil || !ok {
		t.Fatalf("StepAsync: ok %v, %v", ok, err)
	}
	return p
}

// waitOK waits for p, failing t on an error.
func waitOK(t *testing.T, p engine.PendingStep) []engine.StepOutput {
	t.Helper()
	outs, err := p.Wait(context.Background())
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	return outs
}

func openOK(t *testing.T, m engine.Model, ids ...engine.SeqID) {
	t.Helper()
	for _, id := range ids {
		if _, err := m.Open(context.Background(), id, []int32{1, 2, 3, int32(id)}, ""); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSimPipelineHidesTheCallersWork: steps sent before the previous one
// is waited for run back to back on the simulated device, so the caller's
// work between steps, shorter than a step, costs no time.
func TestSimPipelineHidesTheCallersWork(t *testing.T) {
	const stepTime, work, steps = 20 * time.Millisecond, 12 * time.Millisecond, 8
	_, m, pl := newPipeliner(t, WithStepTime(stepTime, 0))
	openOK(t, m, 1)
	defer m.Free(1, "")
	start := time.Now()
	p := sendOK(t, pl, sampleIn(1, 1, 2, 3, 1))
	for range steps - 1 {
		next := sendOK(t, pl, prevIn(1))
		waitOK(t, p)
		time.Sleep(work) // the caller delivers, admits and plans
		p = next
	}
	waitOK(t, p)
	took := time.Since(start)
	if took < steps*stepTime {
		t.Errorf("%d steps of %v took %v: faster than the device", steps, stepTime, took)
	}
	if sync := steps * (stepTime + work); took > sync-2*work {
		t.Errorf("%d pipelined steps of %v with %v of work between took %v; synchronously they take %v", steps, stepTime, work, took, sync)
	}
}

// TestSimPipelineContract: what a pipelined caller may not do is refused
// with nothing changed — Step and Open while a step is pending, a third
// step, a sequence stepped before its open's Wait, a second Wait — and
// Prev leaves the caller's batch as it was.
func TestSimPipelineContract(t *testing.T) {
	sim, m, pl := newPipeliner(t)
	ctx := context.Background()
	openOK(t, m, 1, 2)
	defer m.Free(1, "")
	defer m.Free(2, "")
	want := step(t, m, 1, []int32{1, 2, 3, 1}, greedy)
	want = step(t, m, 1, []int32{want}, greedy)
	m.Free(1, "")
	openOK(t, m, 1)

	p := sendOK(t, pl, sampleIn(1, 1, 2, 3, 1))
	if _, err := m.Step(ctx, []engine.StepInput{sampleIn(2, 1)}); !errors.Is(err, ErrPending) {
		t.Errorf("Step while a step is pending: %v; want ErrPending", err)
	}
	if _, err := m.Open(ctx, 3, []int32{1}, ""); !errors.Is(err, ErrPending) {
		t.Errorf("Open while a step is pending: %v; want ErrPending", err)
	}
	batch := []engine.StepInput{prevIn(1)}
	q := sendOK(t, pl, batch...)
	if batch[0].Tokens != nil {
		t.Errorf("StepAsync wrote the Prev input's tokens into the caller's batch: %v", batch[0].Tokens)
	}
	if _, _, err := pl.StepAsync(ctx, []engine.StepInput{sampleIn(2, 1)}); !errors.Is(err, ErrPending) {
		t.Errorf("StepAsync with two steps pending: %v; want ErrPending", err)
	}
	po, _ := pl.OpenAsync(ctx, 4, []int32{1, 2}, "")
	waitOK(t, p)
	if _, err := p.Wait(ctx); err == nil {
		t.Error("a second Wait of a pending step succeeded")
	}
	if _, _, err := pl.StepAsync(ctx, []engine.StepInput{sampleIn(4, 1, 2)}); !isInvalid(err) {
		t.Errorf("a step of a sequence whose open was not waited for: %v; want an *engine.InvalidParamError", err)
	}
	if outs := waitOK(t, q); len(outs) != 1 || outs[0].Token != want {
		t.Errorf("the Prev step: %v; want token %d", outs, want)
	}
	if _, err := po.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := po.Wait(ctx); err == nil {
		t.Error("a second Wait of a pending open succeeded")
	}
	waitOK(t, sendOK(t, pl, sampleIn(4, 1, 2)))
	m.Free(4, "")
	if st := sim.Stats(); st.Pipelined != 3 || st.Wasted != 0 {
		t.Errorf("stats %+v; want 3 steps pipelined, none wasted", st)
	}
}

// TestSimPipelineWasted: a sequence freed while a step samples for it
// counts one wasted row; one freed after its last step counts none.
func TestSimPipelineWasted(t *testing.T) {
	sim, m, pl := newPipeliner(t)
	openOK(t, m, 1, 2)
	p := sendOK(t, pl, sampleIn(1, 1, 2, 3, 1), sampleIn(2, 1, 2, 3, 2))
	q := sendOK(t, pl, prevIn(1)) // 2 is done: its length was known
	waitOK(t, p)
	m.Free(2, "")
	m.Free(1, "") // 1 sampled a stop token: its row in q is wasted
	if outs := waitOK(t, q); len(outs) != 1 || outs[0].Seq != 1 {
		t.Errorf("the step whose sequence was freed while it was pending: %v; want its output", outs)
	}
	if st := sim.Stats(); st.Wasted != 1 || st.Pipelined != 2 || st.Steps != 2 || st.OpenSequences != 0 {
		t.Errorf("stats %+v; want 1 row wasted, 2 steps pipelined, none open", st)
	}
}

// TestSimPipelineOptions: WithoutPipeline makes models that are no
// engine.Pipeliner; WithPipelineAbove makes StepAsync decline small
// batches, sending nothing.
func TestSimPipelineOptions(t *testing.T) {
	if _, m := newModel(t, WithoutPipeline()); m != nil {
		if _, ok := m.(engine.Pipeliner); ok {
			t.Errorf("a model loaded WithoutPipeline is an engine.Pipeliner")
		}
		if _, ok := m.(engine.BlockPool); !ok {
			t.Errorf("a model loaded WithoutPipeline lost its other interfaces")
		}
	}
	if _, err := NewSim(WithPipelineAbove(-1)); !errors.Is(err, engine.ErrInvalidParam) {
		t.Errorf("WithPipelineAbove(-1): %v; want ErrInvalidParam", err)
	}
	sim, m, pl := newPipeliner(t, WithPipelineAbove(2))
	openOK(t, m, 1, 2, 3)
	defer func() {
		for id := range engine.SeqID(4) {
			m.Free(id, "")
		}
	}()
	two := []engine.StepInput{sampleIn(1, 1), sampleIn(2, 1)}
	if p, ok, err := pl.StepAsync(context.Background(), two); p != nil || ok || err != nil {
		t.Errorf("StepAsync of 2 inputs WithPipelineAbove(2): %v, ok %v, %v; want declined", p, ok, err)
	}
	waitOK(t, sendOK(t, pl, append(two, sampleIn(3, 1))...))
	if st := sim.Stats(); st.Declined != 1 || st.Pipelined != 1 || st.Steps != 1 {
		t.Errorf("stats %+v; want 1 declined, 1 pipelined, 1 step", st)
	}
}

// lossSeed returns a seed of WithWorkerLoss(0.5, seed) under which the
// first steps are lost as lost says.
func lossSeed(t *testing.T, lost ...bool) uint64 {
	t.Helper()
outer:
	for seed := range uint64(10000) {
		sim, err := NewSim(WithWorkerLoss(0.5, seed))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lost {
			if sim.loseStep() != l {
				continue outer
			}
		}
		return seed
	}
	t.Fatalf("no seed loses steps as %v", lost)
	return 0
}

// TestSimPipelineWorkerLoss: a worker lost with two steps pending fails
// both, whichever was sent first, with engine.ErrWorkerLost, and their
// sequences with them; a new sequence steps fine, and a step of a
// sequence lost before is refused at StepAsync, failing no pending step.
func TestSimPipelineWorkerLoss(t *testing.T) {
	for _, lost := range [][]bool{{false, true}, {true}} {
		_, m, pl := newPipeliner(t, WithWorkerLoss(0.5, lossSeed(t, append(lost, false)...)))
		openOK(t, m, 1, 2, 3)
		p := sendOK(t, pl, sampleIn(1, 1), sampleIn(2, 2))
		q := sendOK(t, pl, prevIn(1))
		for i, ps := range []engine.PendingStep{p, q} {
			if _, err := ps.Wait(context.Background()); !errors.Is(err, engine.ErrWorkerLost) {
				t.Errorf("losses %v: pending step %d: %v; want ErrWorkerLost", lost, i, err)
			}
		}
		if _, err := m.Step(context.Background(), []engine.StepInput{sampleIn(2, 5)}); !errors.Is(err, engine.ErrWorkerLost) {
			t.Errorf("losses %v: a sequence of the lost steps stepped: %v; want ErrWorkerLost", lost, err)
		}
		healthy := sendOK(t, pl, sampleIn(3, 4))
		if _, _, err := pl.StepAsync(context.Background(), []engine.StepInput{prevIn(3), sampleIn(2, 5)}); !errors.Is(err, engine.ErrWorkerLost) {
			t.Errorf("losses %v: StepAsync of a sequence lost before: %v; want ErrWorkerLost", lost, err)
		}
		waitOK(t, healthy)
		for id := range engine.SeqID(4) {
			m.Free(id, "")
		}
	}
}

// TestSimPipelineOutOfMemory: a step that needs more blocks than are
// free fails at its Wait, not at StepAsync; the step behind it is not
// run; the pending step before it is unaffected.
func TestSimPipelineOutOfMemory(t *testing.T) {
	_, m, pl := newPipeliner(t, WithBlockSize(4), WithKVCapacity(16))
	openOK(t, m, 1, 2)
	defer m.Free(1, "")
	defer m.Free(2, "")
	first := sendOK(t, pl, sampleIn(1, 1, 2, 3, 4))
	big := sendOK(t, pl, prevIn(1), sampleIn(2, make([]int32, 13)...))
	waitOK(t, first)
	behind := sendOK(t, pl, prevIn(1))
	if _, err := big.Wait(context.Background()); !errors.Is(err, engine.ErrOutOfMemory) {
		t.Errorf("a step over the pool: %v; want ErrOutOfMemory", err)
	}
	if _, err := behind.Wait(context.Background()); !errors.Is(err, engine.ErrNotRun) {
		t.Errorf("the step behind it: %v; want ErrNotRun", err)
	}
	if free := m.(engine.BlockPool).FreeBlocks(); free != 3 {
		t.Errorf("FreeBlocks %d; want 3 (one sequence of 4 tokens in blocks of 4)", free)
	}
}

// TestSimPipelineClose: Close ends the Wait of a pending step with
// engine.ErrClosed.
func TestSimPipelineClose(t *testing.T) {
	sim, m, pl := newPipeliner(t, WithStepTime(time.Hour, 0))
	openOK(t, m, 1)
	p := sendOK(t, pl, sampleIn(1, 1))
	time.AfterFunc(10*time.Millisecond, func() { _ = sim.Close() })
	if _, err := p.Wait(context.Background()); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("Wait during Close: %v; want ErrClosed", err)
	}
}

// savePrefix steps tokens through a new sequence id and frees it under
// key, so that an open with key reuses them.
func savePrefix(t *testing.T, m engine.Model, id engine.SeqID, key string, tokens []int32) {
	t.Helper()
	if _, err := m.Open(context.Background(), id, tokens, ""); err != nil {
		t.Fatal(err)
	}
	step(t, m, id, tokens, greedy)
	m.Free(id, key)
}

// openingIn is sequence id's first prompt chunk, marked Opening; it
// samples when it is the whole prompt.
func openingIn(id engine.SeqID, prompt []int32, chunk int) engine.StepInput {
	return engine.StepInput{Seq: id, Tokens: prompt[:chunk], Sample: chunk == len(prompt), Params: greedy, Opening: true}
}

// TestSimPipelineOpening: an Opening input feeds the tokens of its chunk
// past the prefix its sequence's open reused — none for a chunk within
// it — whether the open was answered or not, and after a synchronous
// Open too: the sequence gets the tokens of a synchronous Open and Step
// of the rest and holds only the blocks of the tokens it holds.
func TestSimPipelineOpening(t *testing.T) {
	sim, m, pl := newPipeliner(t, WithBlockSize(4))
	ctx, pool, info := context.Background(), m.(engine.BlockPool), m.Info()
	saved := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	savePrefix(t, m, 1, "k", saved)
	prompt := append(slices.Clone(saved), 11, 12, 13, 14, 15, 16)
	const reused = 10
	if r, err := m.Open(ctx, 2, prompt, "k"); err != nil || r != reused {
		t.Fatalf("Open with the saved prefix: reused %d, %v; want %d", r, err, reused)
	}
	want := []int32{step(t, m, 2, prompt[reused:], greedy)}
	want = append(want, step(t, m, 2, want, greedy))
	m.Free(2, "")
	for i, c := range []struct {
		what  string
		chunk int
		open  string // "pending": the open's Wait after the step; "answered": before it; "sync": Open
	}{
		{"a chunk within the reused prefix", 6, "pending"},
		{"a chunk as long as the reused prefix", reused, "answered"},
		{"a chunk past the reused prefix", 13, "pending"},
		{"the whole prompt", len(prompt), "answered"},
		{"the whole prompt after a synchronous Open", len(prompt), "sync"},
	} {
		id := engine.SeqID(10 + i)
		before, fed := pool.FreeBlocks(), sim.Stats().Tokens
		var po engine.PendingOpen
		if c.open == "sync" {
			if _, err := m.Open(ctx, id, prompt, "k"); err != nil {
				t.Fatal(err)
			}
		} else {
			po, _ = pl.OpenAsync(ctx, id, prompt, "k")
		}
		if c.open == "answered" {
			if r, err := po.Wait(ctx); err != nil || r != reused {
				t.Fatalf("%s: the open reused %d, %v; want %d", c.what, r, err, reused)
			}
		}
		got := tokens(waitOK(t, sendOK(t, pl, openingIn(id, prompt, c.chunk))))
		if c.open == "pending" {
			if r, err := po.Wait(ctx); err != nil || r != reused {
				t.Fatalf("%s: the open reused %d, %v; want %d", c.what, r, err, reused)
			}
		}
		held := max(reused, c.chunk)
		if n := sim.Stats().Tokens - fed; n != int64(held-reused) {
			t.Errorf("%s of %d tokens fed %d; want %d", c.what, c.chunk, n, held-reused)
		}
		if free := pool.FreeBlocks(); free != before-info.BlocksFor(held) {
			t.Errorf("%s: FreeBlocks %d; want %d (%d before, a sequence of %d tokens)", c.what, free, before-info.BlocksFor(held), before, held)
		}
		if held < len(prompt) {
			got = append(got, step(t, m, id, prompt[held:], greedy))
		}
		got = append(got, step(t, m, id, got, greedy))
		if !slices.Equal(got, want) {
			t.Errorf("%s: tokens %v; a synchronous Open and Step of the rest gives %v", c.what, got, want)
		}
		m.Free(id, "")
	}
}

// TestSimPipelineOpeningRefused: an Opening input in a Step, with Prev,
// with no tokens, sampling within the reused prefix, not repeating it,
// of a sequence not open or stepped since its open is refused with an
// *engine.InvalidParamError, changing nothing.
func TestSimPipelineOpeningRefused(t *testing.T) {
	sim, m, pl := newPipeliner(t, WithBlockSize(4))
	ctx, pool := context.Background(), m.(engine.BlockPool)
	saved := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	savePrefix(t, m, 1, "k", saved)
	prompt := append(slices.Clone(saved), 11, 12, 13, 14, 15, 16)
	po, _ := pl.OpenAsync(ctx, 2, prompt, "k")
	defer m.Free(2, "")
	prev, empty, differs := openingIn(2, prompt, len(prompt)), openingIn(2, prompt, 0), openingIn(2, slices.Clone(prompt), 12)
	prev.Tokens, prev.Prev = nil, true
	differs.Tokens[3]++
	before, free := sim.Stats(), pool.FreeBlocks()
	if _, err := m.Step(ctx, []engine.StepInput{openingIn(2, prompt, len(prompt))}); !isInvalid(err) {
		t.Errorf("an Opening input in a Step: %v; want an *engine.InvalidParamError", err)
	}
	for what, in := range map[string]engine.StepInput{
		"with Prev":                         prev,
		"with no tokens":                    empty,
		"sampling within the reused prefix": {Seq: 2, Tokens: prompt[:8], Sample: true, Params: greedy, Opening: true},
		"not repeating the reused prefix":   differs,
		"of a sequence not open":            openingIn(3, prompt, 4),
	} {
		if _, _, err := pl.StepAsync(ctx, []engine.StepInput{in}); !isInvalid(err) {
			t.Errorf("an Opening input %s: %v; want an *engine.InvalidParamError", what, err)
		}
	}
	if st := sim.Stats(); st.Steps != before.Steps || st.Tokens != before.Tokens || pool.FreeBlocks() != free {
		t.Errorf("the refusals changed the model: stats %+v, FreeBlocks %d; before %+v, %d", st, pool.FreeBlocks(), before, free)
	}
	waitOK(t, sendOK(t, pl, openingIn(2, prompt, 12)))
	if _, err := po.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := pl.StepAsync(ctx, []engine.StepInput{openingIn(2, prompt, len(prompt))}); !isInvalid(err) {
		t.Errorf("an Opening input of a sequence stepped since its open: %v; want an *engine.InvalidParamError", err)
	}
	waitOK(t, sendOK(t, pl, sampleIn(2, prompt[12:]...)))
}

// brokenPipeliner is a simulated model whose pipelining is broken as how
// says: "tokens", a step with Prev inputs samples off by one; "drops",
// a step drops the outputs of sequences freed while it was pending;
// "runs", a step sent behind a failed one hides engine.ErrNotRun;
// "blocks", FreeBlocks waits while a step is pending; "opening", an
// Opening chunk is fed whole, over the prefix its open reused.
type brokenPipeliner struct {
	engine.Model
	how     string
	freed   map[engine.SeqID]bool
	pending int
}

func (b *brokenPipeliner) StepAsync(ctx context.Context, batch []engine.StepInput) (engine.PendingStep, bool, error) {
	if b.how == "opening" {
		batch = slices.Clone(batch)
		for i := range batch {
			batch[i].Opening = false // its open was waited for: see OpenAsync
		}
	}
	p, ok, err := b.Model.(engine.Pipeliner).StepAsync(ctx, batch)
	if !ok || err != nil {
		return p, ok, err
	}
	b.pending++
	prev := slices.ContainsFunc(batch, func(in engine.StepInput) bool { return in.Prev })
	return brokenPending{b, p, prev}, true, nil
}

func (b *brokenPipeliner) OpenAsync(ctx context.Context, id engine.SeqID, prompt []int32, key string) (engine.PendingOpen, bool) {
	po, ok := b.Model.(engine.Pipeliner).OpenAsync(ctx, id, prompt, key)
	if b.how != "opening" || !ok {
		return po, ok
	}
	reused, err := po.Wait(ctx)
	return doneOpen{reused, err}, true
}

// doneOpen is an open already waited for.
type doneOpen struct {
	reused int
	err    error
}

func (o doneOpen) Wait(context.Context) (int, error) { return o.reused, o.err }

func (b *brokenPipeliner) Free(id engine.SeqID, key string) {
	if b.pending > 0 {
		b.freed[id] = true
	}
	b.Model.Free(id, key)
}

func (b *brokenPipeliner) FreeBlocks() int {
	if b.how == "blocks" && b.pending > 0 {
		time.Sleep(50 * time.Millisecond)
	}
	return b.Model.(engine.BlockPool).FreeBlocks()
}

type brokenPending struct {
	b    *brokenPipeliner
	p    engine.PendingStep
	prev bool
}

func (p brokenPending) Wait(ctx context.Context) ([]engine.StepOutput, error) {
	outs, err := p.p.Wait(ctx)
	p.b.pending--
	switch p.b.how {
	case "tokens":
		for i := range outs {
			if p.prev {
				outs[i].Token = (outs[i].Token + 1) % int32(p.b.Info().VocabSize)
			}
		}
	case "drops":
		outs = slices.DeleteFunc(slices.Clone(outs), func(o engine.StepOutput) bool { return p.b.freed[o.Seq] })
	case "runs":
		if errors.Is(err, engine.ErrNotRun) {
			err = nil
		}
	}
	return outs, err
}

func TestPipelineSuiteFailsBrokenEngines(t *testing.T) {
	sim, err := NewSim(WithVocabSize(500), WithContextLength(512), WithMaxBatch(8), WithBlockSize(16),
		WithStepTime(2*time.Millisecond, 20*time.Microsecond))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	s, err := loadModels(context.Background(), sim, "")
	if err != nil {
		t.Fatal(err)
	}
	m, small := s.m, s.small
	broken := func(m engine.Model, how string) engine.Model {
		return &brokenPipeliner{Model: m, how: how, freed: map[engine.SeqID]bool{}}
	}
	for _, c := range []struct {
		name  string
		check func(testing.TB, *suite)
		how   string
	}{
		{"same_tokens/tokens", checkPipelineSameTokens, "tokens"},
		{"free_pending/drops", checkPipelineFree, "drops"},
		{"not_run/runs", checkPipelineNotRun, "runs"},
		{"free_blocks_pending/blocks", checkPipelineFreeBlocks, "blocks"},
		{"opening_chunk/opening", checkPipelineOpening, "opening"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if failed, msg := runCheck(t, c.check, broken(m, ""), broken(small, "")); failed {
				t.Fatalf("the check fails on the sound engine: %s", msg)
			}
			failed, msg := runCheck(t, c.check, broken(m, c.how), broken(small, c.how))
			if !failed {
				t.Fatal("the check passes a broken engine")
			}
			t.Logf("broken engine caught: %s", msg)
		})
	}
	if st := sim.Stats(); st.OpenSequences != 0 {
		t.Errorf("%d sequences left open by the checks", st.OpenSequences)
	}
}

package pyproc

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// shortWorker loads the tiny model on e's two workers with 4 blocks of
// 16 tokens each and opens sequences 1 to 4 with 20-token prompts: 1 and
// 3 on worker 0, 2 and 4 on worker 1, where sequence 4 is fed 40 tokens.
// Worker 1 then has 1 block free and worker 0 all 4: a step feeding
// sequences 1 and 2 their prompts (2 blocks each) fits the pools' sum
// and worker 0, not worker 1.
func shortWorker(t *testing.T, e *Engine) *Model {
	t.Helper()
	m := loadPool(t, e, 8)
	for id := engine.SeqID(1); id <= 4; id++ {
		if _, err := m.Open(context.Background(), id, prompt(int(id), 20), ""); err != nil {
			t.Fatal(err)
		}
		if slot := m.seqs[id].proc.slot; slot != int(id+1)%2 {
			t.Fatalf("sequence %d opened on worker %d, want %d", id, slot, (id+1)%2)
		}
	}
	if _, err := stepSeq(m, 4, prompt(9, 40), false); err != nil {
		t.Fatal(err)
	}
	if free := m.FreeBlocks(); free != 5 {
		t.Fatalf("%d blocks free, want 4 on worker 0 and 1 on worker 1", free)
	}
	return m
}

// partialOutputs checks that err is an *engine.PartialStepError for a
// step whose first input ran and whose second was left for why, and
// returns the outputs of the inputs that ran.
func partialOutputs(t *testing.T, outs []engine.StepOutput, err error, why error) []engine.StepOutput {
	t.Helper()
	var part *engine.PartialStepError
	switch {
	case err == nil:
		t.Fatalf("the step ran whole (%v); worker 1 has no blocks for its part", outs)
	case errors.Is(err, engine.ErrOutOfMemory) || errors.Is(err, engine.ErrNotRun):
		t.Fatalf("a step whose part on worker 0 ran claims to have changed nothing: %v", err)
	case !errors.As(err, &part):
		t.Fatalf("%v, want an *engine.PartialStepError", err)
	case !slices.Equal(part.Ran, []bool{true, false}) || !errors.Is(part.Err, why):
		t.Fatalf("ran %v, the others for %v; want [true false] and %v", part.Ran, part.Err, why)
	case len(part.Outputs) != 1 || part.Outputs[0].Seq != 1:
		t.Fatalf("outputs %+v, want sequence 1's", part.Outputs)
	}
	return part.Outputs
}

// stepBoth steps sequence 1 (which has sampled gotA) and sequence 2 (fed
// its prompt pb again: the refused part left it unchanged) together
// until 2 has sampled n tokens; it returns both sequences' tokens.
func stepBoth(t *testing.T, m *Model, gotA, pb []int32, n int) (a, b []int32) {
	t.Helper()
	feedB := pb
	for len(b) < n {
		outs, err := m.Step(context.Background(), []engine.StepInput{{Seq: 1, Tokens: gotA[len(gotA)-1:], Sample: true, Params: greedy}, {Seq: 2, Tokens: feedB, Sample: true, Params: greedy}})
		if err != nil {
			t.Fatal(err)
		}
		gotA, b = append(gotA, outs[0].Token), append(b, outs[1].Token)
		feedB = b[len(b)-1:]
	}
	return gotA, b
}

// TestPartialStepShortWorker: a step whose part on one worker is refused
// for want of blocks while the other worker has room runs that worker's
// part and returns an *engine.PartialStepError, not ErrOutOfMemory (which
// would tell the caller nothing changed, and have it feed the sequence
// that ran the same tokens again). The sequence that ran goes on from its
// output, the refused one is fed its prompt again once blocks are free,
// and both give the tokens they give alone.
func TestPartialStepShortWorker(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, WithWorkers(2), WithLookahead(1), WithTuning(Tuning{NoPrefixCache: true, NoOverlap: true}))
	pa, pb := prompt(1, 20), prompt(2, 20)
	ref := loadPool(t, e, 64)
	wantA, wantB := generate(t, ref, 1, pa, 3), generate(t, ref, 2, pb, 3)
	m := shortWorker(t, e)
	outs, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: pa, Sample: true, Params: greedy}, {Seq: 2, Tokens: pb, Sample: true, Params: greedy}})
	gotA := []int32{partialOutputs(t, outs, err, engine.ErrOutOfMemory)[0].Token}
	m.Free(4, "")
	gotA, gotB := stepBoth(t, m, gotA, pb, len(wantB))
	if !slices.Equal(gotA[:len(wantA)], wantA) || !slices.Equal(gotB, wantB) {
		t.Errorf("after a step that ran on worker 0 only: %v and %v; alone %v and %v", gotA, gotB, wantA, wantB)
	}
}

// TestPipelinePartialStep: pipelined, the step refused on worker 1 runs
// on worker 0; the step sent behind it runs its part on worker 0 and not
// its part on worker 1 (an *engine.PartialStepError wrapping neither
// sentinel), and a step behind that one with nothing on worker 1 runs
// whole. The sequences then give the tokens they give alone.
func TestPipelinePartialStep(t *testing.T) {
	ctx := context.Background()
	e := pipeEngine(t, WithWorkers(2), WithTuning(Tuning{NoPrefixCache: true, NoOverlap: true}))
	pa, pb := prompt(1, 20), prompt(2, 20)
	ref := loadPool(t, e, 64)
	wantA, wantB := generate(t, ref, 1, pa, 4), generate(t, ref, 2, pb, 2)
	m := shortWorker(t, e)
	send := func(batch ...engine.StepInput) engine.PendingStep {
		t.Helper()
		p, ok, err := m.StepAsync(ctx, batch)
		if err != nil || !ok {
			t.Fatalf("StepAsync: ok %v, %v", ok, err)
		}
		return p
	}
	prev := func(seq engine.SeqID) engine.StepInput {
		return engine.StepInput{Seq: seq, Prev: true, Sample: true, Params: greedy}
	}
	n := send(engine.StepInput{Seq: 1, Tokens: pa, Sample: true, Params: greedy}, engine.StepInput{Seq: 2, Tokens: pb, Sample: true, Params: greedy})
	n1 := send(prev(1), prev(2))
	outs, err := n.Wait(ctx)
	gotA := []int32{partialOutputs(t, outs, err, engine.ErrOutOfMemory)[0].Token}
	n2 := send(prev(1))
	outs, err = n1.Wait(ctx)
	gotA = append(gotA, partialOutputs(t, outs, err, engine.ErrNotRun)[0].Token)
	outs, err = n2.Wait(ctx)
	if err != nil {
		t.Fatalf("a step behind a partial one, with nothing on the worker that refused: %v", err)
	}
	gotA = append(gotA, outs[0].Token)
	m.Free(4, "")
	gotA, gotB := stepBoth(t, m, gotA, pb, len(wantB))
	if !slices.Equal(gotA[:len(wantA)], wantA) || !slices.Equal(gotB, wantB) {
		t.Errorf("after pipelined steps that ran on worker 0 only: %v and %v; alone %v and %v", gotA, gotB, wantA, wantB)
	}
	if m.inflight != 0 || m.pending != nil {
		t.Errorf("after the steps: %d out, pending %v", m.inflight, m.pending)
	}
}

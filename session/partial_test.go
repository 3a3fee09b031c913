package session

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// partialOnce wraps a model: armed, its next step of two inputs or more
// runs the first only and leaves the others unchanged, as an engine of
// two workers whose second is short of blocks.
type partialOnce struct {
	engine.Model
	armed bool
}

func (p *partialOnce) Step(ctx context.Context, batch []engine.StepInput) ([]engine.StepOutput, error) {
	if !p.armed || len(batch) < 2 {
		return p.Model.Step(ctx, batch)
	}
	p.armed = false
	outs, err := p.Model.Step(ctx, batch[:1])
	if err != nil {
		return nil, err
	}
	ran := make([]bool, len(batch))
	ran[0] = true
	return nil, &engine.PartialStepError{Ran: ran, Outputs: outs, Err: fmt.Errorf("worker 1: %w", engine.ErrOutOfMemory)}
}

// TestStepRunInPartIndexesWhatRan: after a step that ran in part the
// index holds what each sequence was fed: the prompt of the one that
// ran, and the other's prompt once, fed again after the step.
func TestStepRunInPartIndexesWhatRan(t *testing.T) {
	ctx := context.Background()
	c := newCache(t, &partialOnce{Model: newSimModel(t), armed: true})
	p1, p2 := tokens(1, 40), tokens(2, 40)
	for id, p := range map[engine.SeqID][]int32{1: p1, 2: p2} {
		if _, err := c.Open(ctx, id, p, ""); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: p1, Sample: true, Params: greedy}, {Seq: 2, Tokens: p2, Sample: true, Params: greedy}})
	var part *engine.PartialStepError
	if !errors.As(err, &part) || len(part.Outputs) != 1 {
		t.Fatalf("the wrapped step: %v, want a partial step with one output", err)
	}
	if _, err := c.Step(ctx, []engine.StepInput{{Seq: 2, Tokens: p2, Sample: true, Params: greedy}}); err != nil {
		t.Fatal(err)
	}
	c.Free(1, "a")
	c.Free(2, "b")
	if st := c.Stats(); st.Keys != 2 || st.Tokens != len(p1)+len(p2) {
		t.Errorf("index of %d keys and %d tokens; want 2 and %d, each prompt once", st.Keys, st.Tokens, len(p1)+len(p2))
	}
}

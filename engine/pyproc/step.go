package pyproc

import (
	"context"
	"fmt"

	"github.com/mlxserving/mlxserving/engine"
)

// Step runs one forward pass. Inputs on different workers go out together
// and run in parallel; the outputs come back in input order. A sequence
// whose worker died fails the step with an error wrapping
// engine.ErrWorkerLost.
func (m *Model) Step(ctx context.Context, batch []engine.StepInput) ([]engine.StepOutput, error) {
	if err := m.usable(); err != nil {
		return nil, err
	}
	if err := m.checkBatch(batch); err != nil {
		return nil, err
	}
	for _, g := range m.groups {
		g.idx, g.reply, g.err = g.idx[:0], nil, nil
	}
	order := make([]*proc, 0, len(m.e.slots))
	for i := range batch {
		ref := m.seqs[batch[i].Seq]
		if !ref.proc.alive() {
			return nil, ref.proc.lost()
		}
		g := m.groups[ref.proc]
		if g == nil {
			g = &stepGroup{}
			m.groups[ref.proc] = g
		}
		if len(g.idx) == 0 {
			order = append(order, ref.proc)
		}
		g.idx = append(g.idx, i)
	}
	for _, p := range order {
		g := m.groups[p]
		g.id, g.ch, g.err = p.send(func(b []byte, id uint64) []byte {
			return appendStep(b, id, m.handle, m.info.VocabSize, batch, g.idx)
		}, true)
	}
	var firstErr error
	for _, p := range order {
		g := m.groups[p]
		if g.err == nil {
			g.reply, g.err = p.wait(ctx, m.spec.ID, g.id, g.ch)
		}
		if g.err != nil && firstErr == nil {
			firstErr = g.err
		}
	}
	m.dropDeadGroups()
	if firstErr != nil {
		return nil, firstErr
	}
	return m.collect(batch, order)
}

func (m *Model) checkBatch(batch []engine.StepInput) error {
	if len(batch) > m.info.MaxBatch {
		return &engine.InvalidParamError{Param: "batch", Reason: fmt.Sprintf("%d inputs exceed MaxBatch %d", len(batch), m.info.MaxBatch)}
	}
	for i := range batch {
		in := &batch[i]
		if len(in.Tokens) == 0 {
			return &engine.InvalidParamError{Param: "tokens", Reason: fmt.Sprintf("sequence %d: no tokens to feed", in.Seq)}
		}
		if _, ok := m.seqs[in.Seq]; !ok {
			return &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d is not open", in.Seq)}
		}
		if in.Sample && in.Params != nil {
			if err := in.Params.Validate(); err != nil {
				return err
			}
			if err := in.Params.CheckVocab(m.info.VocabSize); err != nil {
				return err
			}
		}
		if in.Sample {
			if err := engine.CheckMask(in.Allowed, m.info.VocabSize); err != nil {
				return err
			}
		}
		for j := 0; j < i; j++ {
			if batch[j].Seq == in.Seq {
				return &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d appears twice in one batch", in.Seq)}
			}
		}
	}
	return nil
}

// collect puts the workers' sampled tokens back in input order.
func (m *Model) collect(batch []engine.StepInput, order []*proc) ([]engine.StepOutput, error) {
	at := m.outAt[:0]
	n := 0
	for i := range batch {
		at = append(at, n)
		if batch[i].Sample {
			n++
		}
	}
	m.outAt = at
	outs := make([]engine.StepOutput, n)
	for _, p := range order {
		g := m.groups[p]
		k := 0
		for _, i := range g.idx {
			if !batch[i].Sample {
				continue
			}
			if k >= len(g.reply.Tokens) {
				return nil, &WorkerError{Code: "internal", Message: fmt.Sprintf("step reply has %d tokens, want more", len(g.reply.Tokens))}
			}
			o := &outs[at[i]]
			o.Seq, o.Token = batch[i].Seq, g.reply.Tokens[k]
			if k < len(g.reply.Logprobs) {
				o.Logprob = g.reply.Logprobs[k]
			}
			if k < len(g.reply.Top) && len(g.reply.Top[k]) > 0 {
				o.Top = make([]engine.TokenLogprob, len(g.reply.Top[k]))
				for j, e := range g.reply.Top[k] {
					o.Top[j] = engine.TokenLogprob{Token: int32(e[0]), Logprob: float32(e[1])}
				}
			}
			k++
		}
	}
	return outs, nil
}

// dropDeadGroups forgets scratch kept for workers that have died.
func (m *Model) dropDeadGroups() {
	for p := range m.groups {
		if !p.alive() {
			delete(m.groups, p)
		}
	}
}

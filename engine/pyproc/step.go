package pyproc

import (
	"context"
	"fmt"

	"github.com/mlxserving/mlxserving/engine"
)

// Step runs one forward pass. Inputs on different workers go out together
// and run in parallel; the outputs come back in input order. A sequence
// whose worker died fails the step with an error wrapping
// engine.ErrWorkerLost. With lookahead (WithLookahead) a step may be
// answered from tokens the worker decoded ahead, without a round trip.
// A step whose ctx is already done returns ctx's error and sends nothing.
func (m *Model) Step(ctx context.Context, batch []engine.StepInput) ([]engine.StepOutput, error) {
	if err := m.usable(); err != nil {
		return nil, err
	}
	// A step cancelled before it starts sends nothing: otherwise a worker
	// that answers at once races the cancellation in wait's select.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := m.checkBatch(batch); err != nil {
		return nil, err
	}
	if err := m.checkPooled(batch); err != nil {
		return nil, err
	}
	if m.k > 1 {
		if outs := m.fromBuffers(batch); outs != nil {
			return outs, nil
		}
	}
	plan := m.planStep(batch)
	for _, g := range m.groups {
		g.idx, g.reply, g.err = g.idx[:0], nil, nil
	}
	order := make([]*proc, 0, len(m.e.slots))
	for i := range batch {
		ref := m.seqs[batch[i].Seq]
		if !ref.proc.alive() {
			return nil, ref.proc.lost()
		}
		if plan[i].send == nil {
			continue
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
			return appendStep(b, id, m.handle, m.info.VocabSize, batch, plan, g.idx)
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
	for _, p := range order {
		if g := m.groups[p]; g.err == nil {
			m.noteReply(p, g.id, g.reply)
		}
		m.readFrees(p) // answered before this step
	}
	m.dropDeadGroups()
	if firstErr != nil {
		return nil, firstErr
	}
	return m.collect(batch, plan, order)
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
			if err := checkLoop(in, m.info.VocabSize); err != nil {
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

// checkLoop refuses a negative LoopSteps and a loop too short for the
// vocabulary.
func checkLoop(in *engine.StepInput, vocab int) error {
	switch {
	case in.LoopSteps < 0:
		return &engine.InvalidParamError{Param: "loop", Reason: fmt.Sprintf("sequence %d: LoopSteps %d is negative", in.Seq, in.LoopSteps)}
	case in.LoopSteps > 0 && len(in.Loop) < engine.MaskWords(vocab):
		return &engine.InvalidParamError{Param: "loop", Reason: fmt.Sprintf("sequence %d: loop of %d words; a vocabulary of %d needs %d", in.Seq, len(in.Loop), vocab, engine.MaskWords(vocab))}
	}
	return nil
}

// collect puts the workers' sampled tokens back in input order, taking
// lookahead buffers into account.
func (m *Model) collect(batch []engine.StepInput, plan []inPlan, order []*proc) ([]engine.StepOutput, error) {
	// k[i]: input i's index among the sampling inputs its worker was sent.
	at := m.outAt[:0]
	for range batch {
		at = append(at, -1)
	}
	for _, p := range order {
		k := 0
		for _, i := range m.groups[p].idx {
			if batch[i].Sample {
				at[i] = k
				k++
			}
		}
	}
	m.outAt = at
	outs := make([]engine.StepOutput, 0, len(batch))
	for i := range batch {
		in := &batch[i]
		if !in.Sample {
			if st := m.look[in.Seq]; st != nil && plan[i].send != nil { // rolled back by the worker
				st.buf, st.has = st.buf[:0], false
			}
			continue
		}
		var r *reply
		if plan[i].send != nil {
			r = m.groups[m.seqs[in.Seq].proc].reply
		}
		if plan[i].pooled {
			o, err := m.pooledOutput(in, r, at[i])
			if err != nil {
				return nil, err
			}
			outs = append(outs, o)
			continue
		}
		o, err := m.absorb(in, &plan[i], r, at[i])
		if err != nil {
			return nil, err
		}
		outs = append(outs, o)
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
	m.forgetDeadPools()
}

package pyproc

import (
	"context"
	"errors"
	"fmt"

	"github.com/mlxserving/mlxserving/engine"
)

// stepRun is one step on its way through the workers: the scratch it is
// planned with, from its send to its wait. A pipelined step (pipeline.go)
// is sent while the step before it is still out, so each keeps its own;
// runs are reused (Model.spare), so the synchronous path allocates no more
// than before.
type stepRun struct {
	batch  []engine.StepInput // the step's inputs: Step's caller's, or copy
	copy   []engine.StepInput // StepAsync's copy of its caller's
	plan   []inPlan
	procs  []*proc // each input's worker as at send: a Free while the step is out still lets its reply decode
	order  []*proc // the workers sent a group, in send order
	groups map[*proc]*stepGroup
	outAt  []int
}

type stepGroup struct {
	idx   []int // batch indices on this worker
	id    uint64
	ch    chan *reply
	err   error
	reply *reply
}

// Step runs one forward pass. Inputs on different workers go out together
// and run in parallel; the outputs come back in input order. A sequence
// whose worker died fails the step with an error wrapping
// engine.ErrWorkerLost. A worker short of blocks for its part refuses
// it, changing nothing: the step then fails with engine.ErrOutOfMemory
// when no other worker ran its part, and otherwise returns an
// *engine.PartialStepError (outcome). With lookahead (WithLookahead) a
// step may be answered from tokens the worker decoded ahead, without a
// round trip. A step whose ctx is already done returns ctx's error and
// sends nothing.
func (m *Model) Step(ctx context.Context, batch []engine.StepInput) ([]engine.StepOutput, error) {
	if err := m.stepUsable(ctx, batch, false, nil); err != nil {
		return nil, err
	}
	if m.k > 1 {
		if outs := m.fromBuffers(batch); outs != nil {
			return outs, nil
		}
	}
	r := m.takeRun()
	defer m.putRun(r)
	if err := m.sendStep(r, batch, nil); err != nil {
		return nil, err
	}
	return m.waitStep(ctx, r)
}

// stepUsable checks what Step and StepAsync check before planning: a live
// model, a ctx not done (a step cancelled before it starts sends nothing:
// otherwise a worker that answers at once races the cancellation in
// wait's select) and the batch; async is set for StepAsync, and behind is
// the step it sends the batch behind (nil: none).
func (m *Model) stepUsable(ctx context.Context, batch []engine.StepInput, async bool, behind *pendingStep) error {
	if err := m.usable(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := m.checkBatch(batch, async, behind); err != nil {
		return err
	}
	return m.checkPooled(batch)
}

// takeRun returns a spare stepRun, or a new one.
func (m *Model) takeRun() *stepRun {
	if n := len(m.spare); n > 0 {
		r := m.spare[n-1]
		m.spare = m.spare[:n-1]
		return r
	}
	return &stepRun{groups: map[*proc]*stepGroup{}}
}

// putRun keeps r for a later step, holding none of its inputs.
func (m *Model) putRun(r *stepRun) {
	m.dropDeadGroups(r)
	clear(r.copy)
	r.batch, r.copy = nil, r.copy[:0]
	m.spare = append(m.spare, r)
}

// sendStep plans batch into r and sends each worker its group. behind is
// the pending step it is sent behind (nil: none): each worker's request
// then names the request of that step it follows ("after"). An error
// before any send (a lost worker) sends nothing; a send that fails is
// kept in its group and returned by waitStep.
func (m *Model) sendStep(r *stepRun, batch []engine.StepInput, behind *stepRun) error {
	r.batch = batch
	r.plan = m.planStep(batch, r.plan[:0])
	for _, g := range r.groups {
		g.idx, g.reply, g.err = g.idx[:0], nil, nil
	}
	r.order, r.procs = r.order[:0], r.procs[:0]
	for i := range batch {
		ref := m.seqs[batch[i].Seq]
		if !ref.proc.alive() {
			return ref.proc.lost()
		}
		r.procs = append(r.procs, ref.proc)
		if r.plan[i].send == nil {
			continue
		}
		g := r.groups[ref.proc]
		if g == nil {
			g = &stepGroup{}
			r.groups[ref.proc] = g
		}
		if len(g.idx) == 0 {
			r.order = append(r.order, ref.proc)
		}
		g.idx = append(g.idx, i)
	}
	for _, p := range r.order {
		g := r.groups[p]
		after := behind.sentTo(p)
		g.id, g.ch, g.err = p.send(func(b []byte, id uint64) []byte {
			return appendStep(b, id, m.handle, m.info.VocabSize, batch, r.plan, g.idx, after)
		}, true)
	}
	m.noteFed(batch)
	return nil
}

// sentTo is the id of r's request to worker p; 0 when r is nil or sent p
// nothing.
func (r *stepRun) sentTo(p *proc) uint64 {
	if r == nil {
		return 0
	}
	if g := r.groups[p]; g != nil && len(g.idx) > 0 {
		return g.id
	}
	return 0
}

// waitStep reads the replies of r's groups and returns the step's
// outputs or its error (outcome).
func (m *Model) waitStep(ctx context.Context, r *stepRun) ([]engine.StepOutput, error) {
	m.waitGroups(ctx, r)
	return m.finish(r, r.outcome(false))
}

// waitGroups waits for every group of r that was sent and takes the pool
// reports of those that answered.
func (m *Model) waitGroups(ctx context.Context, r *stepRun) {
	for _, p := range r.order {
		if g := r.groups[p]; g.err == nil {
			g.reply, g.err = p.wait(ctx, m.spec.ID, g.id, g.ch)
		}
	}
	for _, p := range r.order {
		if g := r.groups[p]; g.err == nil {
			m.noteReply(p, g.id, g.reply)
			m.paid(p, r, g)
		}
		m.readArrivedFrees(p) // answered before this step
	}
}

// outcome is the error of the step r once its groups were waited for;
// behindFailed tells whether the step it was sent behind failed. A group
// that failed on its own (a lost worker, a cancelled wait, a bad batch)
// fails the step. Groups that changed nothing — refused for want of
// blocks in their worker's pool, or not run behind a step that failed on
// their worker — give their error when no group ran, and otherwise an
// *engine.PartialStepError, whose Outputs finish fills in: never
// ErrOutOfMemory or ErrNotRun while some worker ran its part, as the
// caller then steps the batch again (engine.BlockPool). When every group
// ran the step succeeded, even behind a step that failed: each worker
// ran it behind its own part of that one (PROTOCOL.md, "after").
func (r *stepRun) outcome(behindFailed bool) error {
	var refused, notRun error
	ran := false
	for _, p := range r.order {
		switch g := r.groups[p]; {
		case g.err == nil:
			ran = true
		case errors.Is(g.err, engine.ErrOutOfMemory):
			if refused == nil {
				refused = g.err
			}
		case errors.Is(g.err, engine.ErrNotRun):
			if notRun == nil {
				notRun = g.err
			}
		default:
			return g.err
		}
	}
	left := refused // a refusal says more to the caller: it gives blocks back
	if left == nil {
		left = notRun
	}
	switch {
	case left == nil && !ran && behindFailed: // nothing sent
		return fmt.Errorf("pyproc: %w", engine.ErrNotRun)
	case left == nil:
		return nil
	case !ran:
		return left
	}
	part := &engine.PartialStepError{Ran: make([]bool, len(r.batch)), Err: left}
	for i := range r.batch {
		part.Ran[i] = r.ran(i)
	}
	return part
}

// ran reports whether input i of r ran: it was not sent (lookahead served
// it), or its worker ran the group it was in.
func (r *stepRun) ran(i int) bool {
	return r.plan[i].send == nil || r.groups[r.procs[i]].err == nil
}

// finish returns the outputs of the step r, whose outcome is err: those
// of every input, or on a partial step those of the inputs that ran, in
// the error.
func (m *Model) finish(r *stepRun, err error) ([]engine.StepOutput, error) {
	var part *engine.PartialStepError
	switch {
	case err == nil:
		return m.collect(r)
	case errors.As(err, &part):
		outs, err := m.collect(r)
		if err != nil {
			return nil, err
		}
		part.Outputs = outs
		return nil, part
	}
	return nil, err
}

// checkBatch checks a batch for Step (async false) or for StepAsync,
// sent behind the pending step behind (nil when none is pending).
func (m *Model) checkBatch(batch []engine.StepInput, async bool, behind *pendingStep) error {
	if len(batch) > m.info.MaxBatch {
		return &engine.InvalidParamError{Param: "batch", Reason: fmt.Sprintf("%d inputs exceed MaxBatch %d", len(batch), m.info.MaxBatch)}
	}
	hint := 0
	for i := range batch {
		in := &batch[i]
		if in.Prev {
			if err := m.checkPrev(in, behind, &hint); err != nil {
				return err
			}
		} else if len(in.Tokens) == 0 {
			return &engine.InvalidParamError{Param: "tokens", Reason: fmt.Sprintf("sequence %d: no tokens to feed", in.Seq)}
		}
		if _, ok := m.seqs[in.Seq]; !ok {
			return &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d is not open", in.Seq)}
		}
		if in.Opening {
			if err := m.checkOpening(in, async); err != nil {
				return err
			}
		} else if len(m.opening) > 0 && m.opening[in.Seq] != nil {
			return &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d: its open was not waited for", in.Seq)}
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
// lookahead buffers into account. Inputs whose worker did not run its
// group (a partial step) are left out, their sequences as they were.
func (m *Model) collect(r *stepRun) ([]engine.StepOutput, error) {
	batch, plan := r.batch, r.plan
	// at[i]: input i's index among the sampling inputs its worker was sent.
	at := r.outAt[:0]
	for range batch {
		at = append(at, -1)
	}
	for _, p := range r.order {
		k := 0
		for _, i := range r.groups[p].idx {
			if batch[i].Sample {
				at[i] = k
				k++
			}
		}
	}
	r.outAt = at
	outs := make([]engine.StepOutput, 0, len(batch))
	for i := range batch {
		in := &batch[i]
		if !r.ran(i) {
			continue
		}
		if !in.Sample {
			if st := m.look[in.Seq]; st != nil && plan[i].send != nil { // rolled back by the worker
				st.buf, st.has = st.buf[:0], false
			}
			continue
		}
		var rep *reply
		if plan[i].send != nil {
			rep = r.groups[r.procs[i]].reply
		}
		if plan[i].pooled {
			o, err := m.pooledOutput(in, rep, at[i])
			if err != nil {
				return nil, err
			}
			outs = append(outs, o)
			continue
		}
		o, err := m.absorb(in, &plan[i], rep, at[i])
		if err != nil {
			return nil, err
		}
		outs = append(outs, o)
	}
	return outs, nil
}

// dropDeadGroups forgets scratch kept for workers that have died.
func (m *Model) dropDeadGroups(r *stepRun) {
	for p := range r.groups {
		if !p.alive() {
			delete(r.groups, p)
		}
	}
	m.forgetDeadPools()
}

package pyproc

import (
	"context"
	"errors"
	"fmt"

	"github.com/mlxserving/mlxserving/engine"
)

// Pipelined steps (engine.Pipeliner; PROTOCOL.md, "Pipelined steps"):
// StepAsync sends a step while the step before it is still out, so the
// worker finds it in its pipe the moment it replies to that one. A Prev
// input goes as a null row, which the worker feeds the token it sampled
// for the sequence in the step before; each worker's request names the
// request of the pending step it follows ("after"), and a worker whose
// step before failed runs nothing of it (not_run). The Model implements
// it when every worker's handshake lists "pipeline".
//
// An Opening input (engine.StepInput.Opening) carries a sequence's first
// prompt chunk from its first token, sent behind its OpenAsync before the
// open was answered: the request lists the sequence in "opening", and the
// worker drops the tokens the open reused before it runs the step. It
// goes to the worker the open was sent to (m.seqs records it at send).
//
// Frees and FreeBlocks never wait while a step or open is out (a free sent
// behind a step is answered after it): blocks.go reads the free replies
// that arrived.

var _ engine.Pipeliner = (*Model)(nil)

// pendingStep is a step StepAsync sent.
type pendingStep struct {
	m      *Model
	run    *stepRun
	behind *pendingStep // the step it was sent behind, until Wait; nil: none
	err    error        // what Wait returned
	waited bool
}

// StepAsync sends batch behind the pending step, if any, without waiting
// for its reply. An Opening input may feed a sequence whose open was sent
// and not waited for (checkOpening). ok is false, with nothing sent, when
// the workers do not pipeline, and when lookahead serves the batch
// better: a batch of up to lookaheadMaxBatch inputs decodes ahead
// (WithLookahead), and a sequence still holding tokens decoded ahead
// takes them from its buffer or is rolled back, which Step does.
func (m *Model) StepAsync(ctx context.Context, batch []engine.StepInput) (engine.PendingStep, bool, error) {
	if !m.pipelines || m.lookaheadServes(batch) {
		return nil, false, nil
	}
	behind := m.pending
	if err := m.stepUsable(ctx, batch, true, behind); err != nil {
		return nil, true, err
	}
	r := m.takeRun()
	var prev *stepRun
	if behind != nil {
		prev = behind.run
	}
	r.copy = append(r.copy[:0], batch...) // the caller may plan the next step in its slice meanwhile
	if err := m.sendStep(r, r.copy, prev); err != nil {
		m.putRun(r)
		return nil, true, err
	}
	ps := &pendingStep{m: m, run: r, behind: behind}
	m.pending = ps
	m.inflight++
	return ps, true, nil
}

// lookaheadServes reports whether Step's lookahead should take batch:
// lookahead is on and the batch small enough for it, or some input's
// sequence holds tokens decoded ahead.
func (m *Model) lookaheadServes(batch []engine.StepInput) bool {
	if m.k <= 1 {
		return false
	}
	if len(batch) <= lookaheadMaxBatch {
		return true
	}
	for i := range batch {
		if st := m.look[batch[i].Seq]; st != nil && len(st.buf) > 0 {
			return true
		}
	}
	return false
}

// checkPrev checks a Prev input against the pending step behind: it
// samples there, and feeds nothing of its own here. *hint is where the
// search of behind's batch starts, left past the input found: callers
// keep their sequences in the same order step after step, so a batch
// checks in linear time.
func (m *Model) checkPrev(in *engine.StepInput, behind *pendingStep, hint *int) error {
	bad := func(reason string) error {
		return &engine.InvalidParamError{Param: "prev", Reason: fmt.Sprintf("sequence %d: %s", in.Seq, reason)}
	}
	switch {
	case behind == nil:
		return bad("Prev needs a pending step (StepAsync) that samples the sequence")
	case in.Tokens != nil:
		return bad("Prev with tokens")
	case !in.Sample || in.Allowed != nil:
		return bad("Prev feeds a sampling input without a mask")
	case m.pooled[in.Seq] != nil:
		return bad("Prev on an embedding sequence")
	}
	prev := behind.run.batch
	for n := range prev {
		i := (*hint + n) % len(prev)
		if prev[i].Seq == in.Seq {
			if !prev[i].Sample {
				return bad("it does not sample in the pending step")
			}
			*hint = i + 1
			return nil
		}
	}
	return bad("it is not in the pending step")
}

// checkOpening checks an Opening input: in a batch for StepAsync, not
// Prev, of a sequence fed nothing since its open (whether or not the open
// was answered yet: the worker skips what it reused either way).
func (m *Model) checkOpening(in *engine.StepInput, async bool) error {
	bad := func(reason string) error {
		return &engine.InvalidParamError{Param: "opening", Reason: fmt.Sprintf("sequence %d: %s", in.Seq, reason)}
	}
	switch {
	case !async:
		return bad("Opening is only for a batch given to StepAsync")
	case in.Prev:
		return bad("an Opening input feeds its prompt's first chunk, not Prev")
	}
	if _, ok := m.fresh[in.Seq]; !ok {
		return bad("it was fed since its open")
	}
	return nil
}

// noteFed records that batch's sequences were sent a step: none of them
// takes an Opening input from now on.
func (m *Model) noteFed(batch []engine.StepInput) {
	if len(m.fresh) == 0 {
		return
	}
	for i := range batch {
		delete(m.fresh, batch[i].Seq)
	}
}

// Wait returns the step's outputs. A step sent behind one that failed
// is not run on the workers where that one failed (the worker answers
// not_run): it returns an error wrapping engine.ErrNotRun when no worker
// ran any of it (nothing changed), an *engine.PartialStepError when some
// did, and its outputs when none of its inputs was on such a worker.
func (ps *pendingStep) Wait(ctx context.Context) ([]engine.StepOutput, error) {
	if ps.waited {
		return nil, errors.New("pyproc: pending step waited for twice")
	}
	ps.waited = true
	m := ps.m
	if m.pending == ps {
		m.pending = nil
	}
	m.inflight--
	behindFailed := ps.behind != nil && ps.behind.err != nil
	ps.behind = nil
	r := ps.run
	defer m.putRun(r)
	m.waitGroups(ctx, r)
	outs, err := m.finish(r, r.outcome(behindFailed))
	ps.err = err
	return outs, err
}

// pendingOpen is an open OpenAsync sent.
type pendingOpen struct {
	m      *Model
	id     engine.SeqID
	slot   *slot
	proc   *proc
	done   func(error) // the slot breaker's admission, reported at Wait (or by a Free after it)
	rid    uint64
	ch     chan *reply
	freed  bool // Free came before Wait
	waited bool
}

// OpenAsync sends an open of a base-model sequence without waiting for
// its reply (engine.Pipeliner). The sequence counts as open from the send
// on, so a Free before Wait is sent behind the open and undoes it, and a
// StepAsync may carry its first chunk as an Opening input. ok is
// false, with nothing sent, when the workers do not pipeline, for an
// encoder (OpenPooled), when the routed worker is being restarted (Open
// waits for it), and when Open would refuse the sequence before asking a
// worker (a closed model, a prompt past the context): the caller's Open
// then reports it, and no step goes out with a first chunk of a sequence
// no worker knows. Adapter and embedding sequences have no asynchronous
// open.
func (m *Model) OpenAsync(ctx context.Context, id engine.SeqID, prompt []int32, prefixKey string) (engine.PendingOpen, bool) {
	if !m.pipelines || m.info.Encoder || ctx.Err() != nil || m.usable() != nil || m.checkOpen(id, prompt) != nil {
		return nil, false
	}
	s, done := m.route(prefixKey, nil, len(prompt))
	s.mu.Lock()
	p := s.cur
	s.mu.Unlock()
	if p == nil || !p.alive() {
		if done != nil {
			done(context.Canceled) // the worker was not asked: not counted either way
		}
		return nil, false
	}
	po := &pendingOpen{m: m, id: id, slot: s, proc: p, done: done}
	var err error
	if po.rid, po.ch, err = p.send(request("open", m.openFields(id, prompt, prefixKey)), true); err != nil {
		po.report(err)
		return nil, false // the worker is going: Open waits for its replacement
	}
	m.seqs[id] = seqRef{slot: s, proc: p}
	m.owe(id, m.owedFor(len(prompt), 0)) // what it reuses is known at Wait
	m.fresh[id] = struct{}{}
	m.opening[id] = po
	s.open.Add(1)
	m.inflight++
	return po, true
}

// Wait returns the open's outcome. An open that failed leaves the
// sequence closed; one freed before Wait is closed already.
func (po *pendingOpen) Wait(ctx context.Context) (int, error) {
	if po.waited {
		return 0, errors.New("pyproc: pending open waited for twice")
	}
	po.waited = true
	m := po.m
	m.inflight--
	if m.opening[po.id] == po {
		delete(m.opening, po.id)
	}
	r, err := po.proc.wait(ctx, m.spec.ID, po.rid, po.ch)
	m.readArrivedFrees(po.proc) // answered before this open
	if err == nil {
		m.noteReply(po.proc, po.rid, r)
	}
	switch {
	case po.freed: // Free released the sequence; the breaker hears the open's outcome
		if err == nil && !po.proc.alive() {
			err = po.proc.lost()
		}
		po.report(err)
	case err != nil:
		m.forgive(m.seqs[po.id])
		delete(m.seqs, po.id)
		delete(m.fresh, po.id)
		po.slot.open.Add(-1)
		po.report(err)
	default: // the breaker hears at Free, as for Open
		ref := m.seqs[po.id]
		ref.done = po.done
		m.seqs[po.id] = ref
		if r.Reused > 0 && ref.owed > 0 { // a step may have fed some of it already
			m.owe(po.id, ref.owed-m.info.BlocksFor(r.Reused))
		}
	}
	if err != nil {
		return 0, err
	}
	return r.Reused, nil
}

// report gives the breaker the outcome.
func (po *pendingOpen) report(err error) {
	if po.done != nil {
		po.done(err)
	}
}

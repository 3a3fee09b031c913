package enginetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

// ErrPending is the error of a simulated model's Step or Open called
// while a step sent by StepAsync is pending: [engine.Pipeliner] allows
// only Free, FreeBlocks, OpenAsync and one more StepAsync then. It marks
// a bug in the caller.
var ErrPending = errors.New("enginetest: a step sent by StepAsync is pending")

// pipeModel is a simulated model that pipelines steps: the models Load
// returns unless [WithoutPipeline]. The methods live on this type, not on
// simModel, so that a model without them is not an engine.Pipeliner.
//
// StepAsync checks and applies its batch at once, so a Prev input resolves
// from its sequence's last sample, an Opening input skips the prefix its
// sequence's open reused (the open ran at once too) and a later Free is
// ordered after the step; Wait delivers the outputs when the simulated device would have
// finished: the step starts when the step before it ends, or when it was
// sent if that is later, and takes the step time of [WithStepTime]. What
// a real worker decides — a step that needs more KV than is free, a
// worker lost ([WithWorkerLoss]), which fails every pending step and open
// with it — fails at Wait, and a step sent behind a step that fails is
// not run: its Wait fails with an error wrapping engine.ErrNotRun (or
// engine.ErrWorkerLost after a loss), having changed nothing.
type pipeModel struct{ *simModel }

var _ engine.Pipeliner = pipeModel{}

// simPending is a step sent by StepAsync.
type simPending struct {
	m     *simModel
	stamp uint64 // the step's stamp; zero for a step that did not run
	out   []engine.StepOutput
	err   error     // the error Wait returns
	grow  int       // KV blocks the step took, which FreeBlocks leaves out while it is pending
	done  time.Time // when the simulated device finishes it
	wait  bool      // Wait was called
}

// StepAsync sends batch behind the pending step, if any; see
// [engine.Pipeliner] and pipeModel. It declines batches of at most the
// size set by [WithPipelineAbove]. A batch the model refuses (an
// *engine.InvalidParamError, an *engine.ContextLengthError, a sequence
// lost before) is refused here with nothing sent, and so is a third step
// ([ErrPending]).
func (m pipeModel) StepAsync(ctx context.Context, batch []engine.StepInput) (engine.PendingStep, bool, error) {
	if len(batch) <= m.sim.cfg.pipelineAbove {
		m.sim.stats.declined.Add(1)
		return nil, false, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.closed:
		return nil, false, fmt.Errorf("enginetest: model %q: step: %w", m.info.ID, engine.ErrClosed)
	case len(m.pending) > 1:
		return nil, false, fmt.Errorf("enginetest: model %q: StepAsync with two steps pending: Wait for the older first: %w", m.info.ID, ErrPending)
	}
	p := &simPending{m: m.simModel, done: later(now, m.busy)}
	if n := len(m.pending); n > 0 && m.pending[n-1].err != nil {
		p.err, p.done = m.notRun(batch, m.pending[n-1].err), m.pending[n-1].done
	} else if err := m.send(p, batch); err != nil {
		return nil, false, err
	}
	m.pending = append(m.pending, p)
	m.sim.stats.pipelined.Add(1)
	return p, true, nil
}

// send runs batch for pending step p, keeping the errors a worker
// decides for p's Wait and returning the others. Has to be called with
// m.mu held.
func (m pipeModel) send(p *simPending, batch []engine.StepInput) error {
	if len(batch) == 0 {
		return nil
	}
	blocks := m.blocks
	out, d, lost, err := m.run(batch, true)
	switch {
	case lost:
		m.lose()
		p.err = err
	case errors.Is(err, engine.ErrOutOfMemory):
		p.err = err
	case err != nil:
		return err
	default:
		p.stamp, p.out, p.grow = m.stamp, out, m.blocks-blocks
		p.done = p.done.Add(d)
		m.busy = p.done
	}
	return nil
}

// notRun is the error of a step sent behind a pending step that failed
// with prev: the worker was lost with the batch's sequences, or the step
// is not run. Has to be called with m.mu held.
func (m *simModel) notRun(batch []engine.StepInput, prev error) error {
	if !errors.Is(prev, engine.ErrWorkerLost) {
		return fmt.Errorf("enginetest: model %q: %w", m.info.ID, engine.ErrNotRun)
	}
	for _, in := range batch {
		if seq := m.seqs[in.Seq]; seq != nil {
			seq.lost = true
		}
	}
	return m.lostError()
}

// lose fails every pending step and open with the simulated worker, after
// a step sent behind them lost it: their sequences are lost too. Has to
// be called with m.mu held.
func (m *simModel) lose() {
	for _, p := range m.pending {
		for _, seq := range m.seqs {
			if p.stamp != 0 && seq.stamp == p.stamp {
				seq.lost = true
			}
		}
		p.out, p.grow, p.err = nil, 0, m.lostError()
	}
	for _, seq := range m.seqs {
		if seq.opening {
			seq.lost = true
		}
	}
}

// Wait returns the step's outputs once the simulated device has run it;
// see [engine.PendingStep].
func (p *simPending) Wait(ctx context.Context) ([]engine.StepOutput, error) {
	m := p.m
	m.mu.Lock()
	if p.wait {
		m.mu.Unlock()
		return nil, fmt.Errorf("enginetest: model %q: Wait of a pending step called twice", m.info.ID)
	}
	p.wait = true
	m.mu.Unlock()
	err := m.waitUntil(ctx, nil, p.done)
	m.mu.Lock()
	defer m.mu.Unlock()
	if i := slices.Index(m.pending, p); i >= 0 {
		m.pending = slices.Delete(m.pending, i, i+1)
	}
	switch {
	case err != nil:
		return nil, err
	case m.closed:
		return nil, m.closedDuringStep()
	}
	return p.out, p.err
}

// resolve returns batch with the Prev inputs' tokens filled in from their
// sequences' unfed samples and the Opening inputs' cut to the tokens past
// the prefix their sequences hold — a copy in m.resolved, leaving the
// caller's batch alone — or batch itself when no input uses either. A
// Prev input must sample, carry no tokens and no mask, be in a batch for
// StepAsync (async) and be of a sequence that sampled in the pending
// step; an Opening input is checked by openingFeed: anything else is an
// *engine.InvalidParamError. Has to be called with m.mu held.
func (m *simModel) resolve(batch []engine.StepInput, async bool) ([]engine.StepInput, error) {
	var pending uint64 // the stamp of the step this batch goes behind
	if n := len(m.pending); async && n > 0 {
		pending = m.pending[n-1].stamp
	}
	out, copied := batch, false
	m.failedRows = m.failedRows[:0]
	dropped := 0
	for i := range batch {
		in := &batch[i]
		if !in.Prev && !in.Opening {
			if copied && dropped > 0 {
				out[i-dropped] = *in
			}
			continue
		}
		if !copied {
			m.resolved = append(m.resolved[:0], batch...)
			m.prevTokens = slices.Grow(m.prevTokens[:0], len(batch))[:len(batch)]
			out, copied = m.resolved, true
		}
		if in.Opening && async && m.openFailed[in.Seq] && m.seqs[in.Seq] == nil {
			// Its open failed: the row feeds nothing, and a sample gets -1.
			if in.Sample {
				m.failedRows = append(m.failedRows, i)
			}
			dropped++
			continue
		}
		k := i - dropped // its place in out
		out[k] = *in
		var err error
		if in.Opening {
			out[k].Tokens, err = m.openingFeed(in, async)
		} else if err = m.checkPrev(in, async, pending); err == nil {
			m.prevTokens[k] = m.seqs[in.Seq].unfed
			out[k].Tokens = m.prevTokens[k : k+1 : k+1]
		}
		if err != nil {
			return nil, err
		}
	}
	return out[:len(out)-dropped], nil
}

// withFailedOpens returns out, the outputs of batch less the rows resolve
// dropped for failed opens, with a Token -1 output for each of those that
// samples, in batch's order.
func (m *simModel) withFailedOpens(batch []engine.StepInput, out []engine.StepOutput) []engine.StepOutput {
	all := make([]engine.StepOutput, 0, len(out)+len(m.failedRows))
	j, f := 0, 0
	for i := range batch {
		if !batch[i].Sample {
			continue
		}
		if f < len(m.failedRows) && m.failedRows[f] == i {
			all = append(all, engine.StepOutput{Seq: batch[i].Seq, Token: -1})
			f++
			continue
		}
		all = append(all, out[j])
		j++
	}
	return all
}

// checkPrev validates a Prev input of a batch that goes behind the step
// of stamp pending (zero: none). Has to be called with m.mu held.
func (m *simModel) checkPrev(in *engine.StepInput, async bool, pending uint64) error {
	seq := m.seqs[in.Seq]
	var why string
	switch {
	case !async:
		why = "Prev is only for a batch given to StepAsync"
	case in.Tokens != nil:
		why = "a Prev input carries no tokens"
	case !in.Sample:
		why = "a Prev input samples"
	case in.Allowed != nil:
		why = "a Prev input carries no allowed-token mask"
	case seq == nil:
		why = "the sequence is not open"
	case pending == 0 || seq.unfedAt != pending:
		why = "the sequence does not sample in the pending step"
	default:
		return nil
	}
	return &engine.InvalidParamError{Param: "prev", Reason: fmt.Sprintf("sequence %d: %s", in.Seq, why)}
}

// openingFeed validates an Opening input of a batch (for StepAsync when
// async) and returns the tokens it feeds: those of its chunk past the
// prefix its sequence holds, which the chunk must repeat; none when the
// chunk lies within it, and then it may not sample. Has to be called with
// m.mu held.
func (m *simModel) openingFeed(in *engine.StepInput, async bool) ([]int32, error) {
	seq := m.seqs[in.Seq]
	var why string
	switch {
	case !async:
		why = "Opening is only for a batch given to StepAsync"
	case in.Prev:
		why = "an Opening input carries its chunk, not Prev"
	case len(in.Tokens) == 0:
		why = "an Opening input carries its first prompt chunk"
	case seq == nil:
		why = "the sequence is not open"
	case !seq.fresh:
		why = "the sequence was stepped since its open: Opening is for its first chunk"
	}
	if why == "" {
		held := len(seq.tokens)
		k := min(held, len(in.Tokens))
		switch {
		case !slices.Equal(in.Tokens[:k], seq.tokens[:k]):
			why = fmt.Sprintf("the chunk does not start with the %d prompt tokens its open reused", k)
		case k == len(in.Tokens) && in.Sample:
			why = fmt.Sprintf("the %d-token chunk lies within the %d tokens its open reused: it feeds nothing to sample from", k, held)
		default:
			return in.Tokens[k:], nil
		}
	}
	return nil, &engine.InvalidParamError{Param: "opening", Reason: fmt.Sprintf("sequence %d: %s", in.Seq, why)}
}

// noteWasted counts the samples that pending steps take for sequence id,
// which is being freed: rows whose tokens nobody reads (SimStats.Wasted).
// Has to be called with m.mu held.
func (m *simModel) noteWasted(id engine.SeqID) {
	for _, p := range m.pending {
		for _, o := range p.out {
			if o.Seq == id && o.Embedding == nil {
				m.sim.stats.wasted.Add(1)
			}
		}
	}
}

// pendingError is the error of op called while a step is pending. Has to
// be called with m.mu held.
func (m *simModel) pendingError(op string) error {
	return fmt.Errorf("enginetest: model %q: %s with %d steps pending: Wait for them first: %w", m.info.ID, op, len(m.pending), ErrPending)
}

// simOpen is an open sent by OpenAsync.
type simOpen struct {
	m      *simModel
	seq    *simSeq
	reused int
	err    error
	wait   bool
}

// OpenAsync opens the sequence at once, as Open does, and returns its
// result from Wait; the sequence may be freed before, and stepped after,
// or before by one Opening input. It may be called while a step is
// pending. ok is always true.
func (m pipeModel) OpenAsync(ctx context.Context, id engine.SeqID, prompt []int32, prefixKey string) (engine.PendingOpen, bool) {
	if m.info.Encoder {
		_, err := m.Open(ctx, id, prompt, prefixKey) // refused
		return &simOpen{m: m.simModel, err: err}, true
	}
	reused, err := m.open(ctx, id, prompt, prefixKey, true)
	o := &simOpen{m: m.simModel, reused: reused, err: err}
	m.mu.Lock()
	if err == nil {
		o.seq = m.seqs[id]
	} else {
		if m.openFailed == nil {
			m.openFailed = map[engine.SeqID]bool{}
		}
		m.openFailed[id] = true
	}
	m.mu.Unlock()
	return o, true
}

// Wait returns what Open would have returned; see [engine.PendingOpen].
func (o *simOpen) Wait(ctx context.Context) (int, error) {
	m := o.m
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case o.wait:
		return 0, fmt.Errorf("enginetest: model %q: Wait of a pending open called twice", m.info.ID)
	case o.err != nil:
		o.wait = true
		return 0, o.err
	}
	o.wait = true
	o.seq.opening = false
	switch {
	case m.closed:
		return 0, fmt.Errorf("enginetest: model %q: open: %w", m.info.ID, engine.ErrClosed)
	case o.seq.lost:
		return 0, m.lostError()
	}
	return o.reused, nil
}

package enginetest

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

// Step feeds every input's tokens to its sequence and samples the next
// token for inputs with Sample set, then waits out the configured step
// time. Bad batches are refused before any sequence changes, and so is a
// Step while a step sent by StepAsync is pending ([ErrPending]).
func (m *simModel) Step(ctx context.Context, batch []engine.StepInput) ([]engine.StepOutput, error) {
	cfg := &m.sim.cfg
	var start time.Time
	if cfg.stepFixed > 0 || cfg.stepPerToken > 0 {
		start = time.Now()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("enginetest: model %q: step: %w", m.info.ID, engine.ErrClosed)
	}
	if len(m.pending) > 0 {
		return nil, m.pendingError("Step")
	}
	if len(batch) == 0 {
		return nil, nil
	}
	out, d, _, err := m.run(batch, false)
	if err != nil {
		return nil, err
	}
	if d > 0 {
		if start.IsZero() {
			start = time.Now()
		}
		deadline := start.Add(d)
		m.busy = later(deadline, m.busy) // a step StepAsync sends next starts after this one
		if err := m.waitUntil(ctx, m.timer, deadline); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// run checks batch and applies it, or loses it with the simulated worker
// as [WithWorkerLoss] says (lost; a batch of a sequence lost before is
// refused as any bad batch): the outputs and the simulated device time
// the step takes. async allows Prev and Opening inputs. Has to be called
// with m.mu held.
func (m *simModel) run(batch []engine.StepInput, async bool) (out []engine.StepOutput, d time.Duration, lost bool, err error) {
	orig := batch
	batch, err = m.resolve(batch, async)
	if err != nil {
		return nil, 0, false, err
	}
	grow, samples, tokens, err := m.check(batch)
	if err != nil {
		return nil, 0, false, err
	}
	if m.sim.loseStep() {
		for _, seq := range m.scratch {
			seq.lost = true
		}
		return nil, 0, true, m.lostError()
	}
	out = m.apply(batch, grow, samples)
	if len(m.failedRows) > 0 {
		out = m.withFailedOpens(orig, out)
	}
	m.sim.stats.steps.Add(1)
	m.sim.stats.tokens.Add(int64(tokens))
	m.sim.stats.sampled.Add(int64(samples))
	m.sim.stats.noteBatch(int64(len(batch)))
	cfg := &m.sim.cfg
	return out, cfg.stepFixed + cfg.stepPerToken*time.Duration(tokens) + m.coldCost(len(batch)), false, nil
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// check validates batch against the model's limits and the sequences'
// state, filling m.scratch with the batch's sequences. It returns the KV
// the batch adds, the number of samples and of tokens fed. Has to be
// called with m.mu held.
func (m *simModel) check(batch []engine.StepInput) (grow, samples, tokens int, err error) {
	growBlocks := 0
	if len(batch) > m.info.MaxBatch {
		return 0, 0, 0, &engine.InvalidParamError{Param: "batch",
			Reason: fmt.Sprintf("%d inputs; model %q takes at most %d per step", len(batch), m.info.ID, m.info.MaxBatch)}
	}
	m.stamp++
	m.scratch = m.scratch[:0]
	for i := range batch {
		in := &batch[i]
		seq, err := m.checkInput(in)
		if err != nil {
			return 0, 0, 0, err
		}
		n := len(seq.tokens) + len(in.Tokens)
		grow += max(0, n-seq.held)
		growBlocks += m.info.BlocksFor(n) - m.info.BlocksFor(seq.held)
		tokens += len(in.Tokens)
		if in.Sample {
			samples++
		}
		m.scratch = append(m.scratch, seq)
	}
	if m.info.Paged() && m.blocks+growBlocks > m.info.KVBlocks {
		return 0, 0, 0, fmt.Errorf("enginetest: model %q: the step needs %d more KV blocks, %d of %d are free: %w",
			m.info.ID, growBlocks, m.info.KVBlocks-m.blocks, m.info.KVBlocks, engine.ErrOutOfMemory)
	}
	if m.kv+grow > m.info.KVCapacity {
		return 0, 0, 0, fmt.Errorf("enginetest: model %q: the step needs %d more KV tokens, %d of %d are free: %w",
			m.info.ID, grow, m.info.KVCapacity-m.kv, m.info.KVCapacity, engine.ErrOutOfMemory)
	}
	return grow, samples, tokens, nil
}

// checkInput validates one input and returns its sequence. Has to be
// called with m.mu held.
func (m *simModel) checkInput(in *engine.StepInput) (*simSeq, error) {
	seq := m.seqs[in.Seq]
	switch {
	case seq == nil:
		return nil, &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d is not open", in.Seq)}
	case seq.opening && !in.Opening:
		return nil, &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d is opening: the Wait of its OpenAsync has not returned", in.Seq)}
	case seq.stamp == m.stamp:
		return nil, &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d appears twice in one batch", in.Seq)}
	case len(in.Tokens) == 0 && !in.Opening: // resolve refused an empty Opening input
		return nil, &engine.InvalidParamError{Param: "tokens", Reason: fmt.Sprintf("sequence %d feeds no tokens", in.Seq)}
	case in.Sample && in.Params == nil && seq.pool == engine.PoolNone:
		return nil, &engine.InvalidParamError{Param: "params", Reason: fmt.Sprintf("sequence %d samples without parameters", in.Seq)}
	}
	if seq.lost {
		return nil, m.lostError()
	}
	if seq.pool != engine.PoolNone {
		if err := m.checkPooled(seq, in); err != nil {
			return nil, err
		}
	}
	seq.stamp = m.stamp
	if n := len(seq.tokens) + len(in.Tokens); n > m.info.ContextLength {
		return nil, &engine.ContextLengthError{Model: m.info.ID, Prompt: n, Limit: m.info.ContextLength}
	}
	if err := m.checkTokens(in.Tokens); err != nil {
		return nil, err
	}
	if in.Sample && seq.pool == engine.PoolNone {
		if err := in.Params.Validate(); err != nil {
			return nil, err
		}
		if err := in.Params.CheckVocab(m.info.VocabSize); err != nil {
			return nil, err
		}
		if err := engine.CheckMask(in.Allowed, m.info.VocabSize); err != nil {
			return nil, err
		}
	}
	return seq, nil
}

// apply feeds a checked batch and samples. Has to be called with m.mu
// held, after check.
func (m *simModel) apply(batch []engine.StepInput, grow, samples int) []engine.StepOutput {
	out := make([]engine.StepOutput, 0, samples)
	for i := range batch {
		in, seq := &batch[i], m.scratch[i]
		var vec []float32
		if seq.pool != engine.PoolNone {
			vec = m.pool(seq, in.Tokens, in.Sample)
		}
		seq.hash = feed(seq.hash, in.Tokens)
		if seq.sampled && in.Params != nil && (in.Params.PresencePenalty != 0 || in.Params.FrequencyPenalty != 0) {
			for _, t := range in.Tokens {
				if seq.gen == nil {
					seq.gen = map[int32]int{}
				}
				seq.gen[t]++
			}
		}
		seq.tokens = append(seq.tokens, in.Tokens...)
		seq.unfedAt, seq.fresh = 0, false
		m.blocks -= m.info.BlocksFor(seq.held)
		seq.held = max(seq.held, len(seq.tokens))
		m.blocks += m.info.BlocksFor(seq.held)
		if !in.Sample {
			continue
		}
		if vec != nil {
			out = append(out, engine.StepOutput{Seq: in.Seq, Token: -1, Embedding: vec})
			continue
		}
		p := in.Params
		if !seq.sampled {
			m.resume(seq, p)
		} else if !m.sim.cfg.noJumpForward {
			seq.draws += len(in.Tokens) - 1 // forced tokens after the sampled one
		}
		seed := seq.seed
		if p.HasSeed {
			seed = p.Seed
		}
		if p.Greedy() {
			seed = 0 // the argmax under a mask or penalties depends on the history alone
		} else {
			seed = drawSeed(seed, seq.draws)
		}
		seq.draws++
		seq.sampled = true
		var tok int32
		var lp float32
		if in.Allowed == nil && !p.Adjusts() {
			tok, lp = m.pick.draw(seq.hash, !p.Greedy(), seed)
		} else {
			tok, lp = m.pick.adjusted(seq.hash, !p.Greedy(), seed, p, in.Allowed, seq.gen)
		}
		o := engine.StepOutput{Seq: in.Seq, Token: tok}
		if p.Logprobs || p.TopLogprobs > 0 {
			o.Logprob = lp
		}
		if p.TopLogprobs > 0 {
			o.Top = m.pick.top(seq.hash, tok, lp, p.TopLogprobs, in.Allowed)
		}
		seq.unfed, seq.unfedAt = tok, m.stamp
		out = append(out, o)
	}
	m.kv += grow
	m.sim.stats.kv.Add(int64(grow))
	return out
}

// resume starts a sequence's sampling state at its first sample: with
// p.Generated set, the draws continue at that generated position and the
// prompt's last Generated tokens count as generated for presence and
// frequency penalties (engine.SamplingParams.Generated). Has to be called
// with m.mu held, after the step's tokens were appended.
func (m *simModel) resume(seq *simSeq, p *engine.SamplingParams) {
	g := min(p.Generated, len(seq.tokens))
	if m.sim.cfg.noResume || g == 0 {
		return
	}
	seq.draws = g
	if p.PresencePenalty == 0 && p.FrequencyPenalty == 0 {
		return
	}
	if seq.gen == nil {
		seq.gen = map[int32]int{}
	}
	for _, t := range seq.tokens[len(seq.tokens)-g:] {
		seq.gen[t]++
	}
}

// lostError is the error of a Step that lost its worker.
func (m *simModel) lostError() error {
	return fmt.Errorf("enginetest: model %q: simulated worker loss: %w", m.info.ID, engine.ErrWorkerLost)
}

// waitUntil waits for the deadline: on timer t (a new one if nil), then
// by polling the clock for the last tenth of the wait (at most a
// millisecond), yielding between polls, as a CUDA stream sync spins. An OS
// timer alone fires 0.2–0.5 ms late on a loaded machine, which would make
// the simulated device slower than it was told to be and count its
// lateness against the serving layer. It ends early with ctx's error or
// engine.ErrClosed. The model's reused timer m.timer is only for callers
// that hold m.mu.
func (m *simModel) waitUntil(ctx context.Context, t *time.Timer, deadline time.Time) error {
	d := time.Until(deadline)
	if d <= 0 {
		return nil
	}
	if sleep := d - min(d/10, time.Millisecond); sleep > 0 {
		if t == nil {
			t = time.NewTimer(sleep)
		} else {
			t.Reset(sleep)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-m.done:
			t.Stop()
			return m.closedDuringStep()
		}
	}
	polled := time.Now()
	defer func() { m.sim.stats.polled.Add(int64(time.Since(polled))) }()
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.done:
			return m.closedDuringStep()
		default:
			runtime.Gosched()
		}
	}
	return nil
}

func (m *simModel) closedDuringStep() error {
	return fmt.Errorf("enginetest: model %q: closed during step: %w", m.info.ID, engine.ErrClosed)
}

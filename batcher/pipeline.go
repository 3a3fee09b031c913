package batcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

// Pipelined steps. On a model that implements engine.Pipeliner (and
// unless WithPipeline(false)), the loop sends step N+1 before it reads
// step N's tokens, as vLLM's async scheduling and SGLang's overlap
// scheduler do: while the device runs N, the batcher delivers N-1's
// tokens, admits, plans N+1 and sends it, so the device finds the next
// step queued when it finishes one. One step is pending at most when the
// next is planned.
//
// A sequence that samples in the pending step feeds that sample in the
// next one without knowing it (engine.StepInput.Prev); its prompt chunks
// go on from where the pending step leaves them (Sequence.ahead). A
// sequence at its last token (MaxTokens, the context) is left out of the
// next step, so a length stop costs nothing; one that stops on an EOS,
// a stop token or a stop string has run one row for nothing, whose
// output delivery drops.
//
// Some steps cannot be planned without the pending step's tokens; the
// loop then delivers the pending step first ("drains") and runs a
// synchronous step:
//   - a running sequence has a Constraint: its next mask depends on the
//     token it samples;
//   - a step would preempt (for blocks or for a waiting higher tier): the
//     victim's blocks would come back only behind the pending step;
//   - an admission the engine does not open asynchronously (an adapter, an
//     embedding, a constrained sequence);
//   - the engine says a batch runs better synchronously (StepAsync's ok);
//   - the step after a failure.

// sentStep is a step sent with StepAsync and not delivered yet.
type sentStep struct {
	id              uint64
	p               engine.PendingStep
	in              []engine.StepInput
	seqs            []*Sequence
	decode, prefill int
	blocks          int // blocks it takes, which FreeBlocks may not count yet
	sent            time.Time
	between         time.Duration
}

// stepAhead is step on a Pipeliner: it plans the next step behind the
// pending one, sends it, then delivers the pending one.
func (b *ContinuousBatcher) stepAhead(ctx context.Context) {
	if b.pend == nil {
		b.resolveOpens(ctx)
		if len(b.running) == 0 {
			return
		}
	}
	if b.syncNext || b.needsSync() {
		if b.pend != nil {
			b.drain(ctx)
			return
		}
		b.syncNext = false
		b.step(ctx)
		return
	}
	b.wantDrain = false
	in, seqs, decode, prefill := b.plan()
	if b.wantDrain || (len(in) == 0 && b.pend != nil) {
		b.drain(ctx)
		return
	}
	if len(in) == 0 {
		b.nothingToStep()
		return
	}
	start := time.Now()
	p, ok, err := b.piper.StepAsync(ctx, in)
	switch {
	case err != nil: // nothing was sent
		b.drain(ctx)
		b.stepFailed(ctx, err, in)
		b.syncNext = true
		return
	case !ok && b.pend != nil:
		b.drain(ctx) // and plan again without Prev rows
		return
	case !ok:
		b.run(ctx, in, seqs, decode, prefill)
		return
	}
	prev := b.pend
	b.pend = b.sent(p, in, seqs, decode, prefill, start)
	if prev != nil {
		b.deliverSent(ctx, prev)
	}
}

// sent records a step StepAsync sent: its inputs move out of the
// planning scratch, and its sequences count what it feeds them.
func (b *ContinuousBatcher) sent(p engine.PendingStep, in []engine.StepInput, seqs []*Sequence, decode, prefill int, start time.Time) *sentStep {
	st := b.spare
	b.spare = nil
	if st == nil {
		st = &sentStep{}
	}
	b.lastSent++
	st.id, st.p, st.decode, st.prefill, st.sent, st.between = b.lastSent, p, decode, prefill, start, b.between(start)
	st.in, b.inputs = in, st.in[:0]
	st.seqs, b.stepSeqs = seqs, st.seqs[:0]
	st.blocks = 0
	for i := range in {
		s, n := seqs[i], in[i].Feeds()
		if b.pool != nil {
			st.blocks += b.grows(s, n)
		}
		s.ahead += n
		if in[i].Sample {
			s.sampleIn = st.id
		}
	}
	b.count(&b.stats.Pipelined)
	return st
}

// deliverSent waits for a sent step and delivers its tokens; the text
// work of the step before it runs meanwhile.
func (b *ContinuousBatcher) deliverSent(ctx context.Context, st *sentStep) {
	text := b.textBehind()
	outs, err := st.p.Wait(ctx)
	now := time.Now()
	text()
	latency := now.Sub(st.sent)
	if !b.stepEnd.IsZero() && b.stepEnd.After(st.sent) {
		latency = now.Sub(b.stepEnd) // the device ran it behind the one before
	}
	b.stepEnd = now
	if err == nil {
		err = b.deliver(st.in, st.seqs, outs, now)
	}
	if err != nil {
		b.sentFailed(ctx, st, err)
	} else {
		b.observe(StepStats{Batch: len(st.in), Decode: st.decode, PrefillTokens: st.prefill, Latency: latency, Between: st.between})
	}
	b.recycle(st)
	b.resolveOpens(ctx)
}

// sentFailed handles a sent step that failed. The step sent behind it
// failed too (engine.ErrNotRun when it was not run); the sequences of
// both are failed unless nothing ran, and the next step is synchronous.
func (b *ContinuousBatcher) sentFailed(ctx context.Context, st *sentStep, err error) {
	b.unsend(st)
	b.syncNext = true
	if errors.Is(err, engine.ErrNotRun) {
		return // it changed nothing: its sequences go on
	}
	failed := st.in
	if next := b.pend; next != nil {
		b.pend = nil
		_, nerr := next.p.Wait(ctx)
		b.unsend(next)
		switch {
		case errors.Is(nerr, engine.ErrNotRun), errors.Is(nerr, engine.ErrOutOfMemory):
			// It changed nothing: its sequences go on.
		case errors.Is(err, engine.ErrOutOfMemory):
			// The refused step changed nothing, but this one ran, in part
			// at least (workers of one step answer apart): its sequences'
			// KV is not what the batcher counts, and the refusal's
			// preemption below fails nothing.
			if nerr == nil {
				nerr = fmt.Errorf("model %s: a step ran behind one refused for want of memory", b.info.ID)
			}
			b.stepFailed(ctx, nerr, next.in)
		default:
			// It ran, or failed on its own: its sequences fail with the
			// step before.
			failed = append(append(make([]engine.StepInput, 0, len(st.in)+len(next.in)), st.in...), next.in...)
		}
		b.recycle(next)
	}
	b.stepFailed(ctx, err, failed)
}

// unsend takes back what an undelivered step counted on its sequences.
func (b *ContinuousBatcher) unsend(st *sentStep) {
	for i := range st.in {
		if s := st.seqs[i]; s.open && s.id == st.in[i].Seq {
			n := st.in[i].Feeds()
			s.ahead = max(s.ahead-n, 0)
			if st.in[i].Opening && s.opening == nil {
				// Its open was answered while the chunk was out: opened
				// left the reused tokens the chunk covers to the chunk.
				s.fed += min(n, s.reused)
				s.kv = s.fed
			}
		}
	}
}

// recycle keeps a delivered step's buffers for the next one.
func (b *ContinuousBatcher) recycle(st *sentStep) {
	clear(st.seqs)
	st.p = nil
	b.spare = st
}

// drain delivers the pending step, if any.
func (b *ContinuousBatcher) drain(ctx context.Context) {
	st := b.pend
	if st == nil {
		return
	}
	b.pend = nil
	b.count(&b.stats.Drains)
	b.deliverSent(ctx, st)
}

// abandon waits for what the loop leaves pending when it stops: a step,
// the opens of sequences freed before their answer.
func (b *ContinuousBatcher) abandon(ctx context.Context) {
	if st := b.pend; st != nil {
		b.pend = nil
		_, _ = st.p.Wait(ctx)
	}
	b.readOrphans(ctx)
}

// readOrphans reads the answers to the opens of sequences freed before
// them, which the engine sent anyway.
func (b *ContinuousBatcher) readOrphans(ctx context.Context) {
	for _, p := range b.orphans {
		_, _ = p.Wait(ctx)
	}
	clear(b.orphans)
	b.orphans = b.orphans[:0]
}

// samplesAhead reports whether s samples in the pending step.
func (b *ContinuousBatcher) samplesAhead(s *Sequence) bool {
	return b.pend != nil && s.sampleIn == b.pend.id
}

// decodesAhead reports whether s, which samples in the pending step,
// samples again in the next: a generating sequence with budget left
// after the pending step's token.
func (b *ContinuousBatcher) decodesAhead(s *Sequence) bool {
	return s.Pool == engine.PoolNone && b.budget(s) > 1
}

// decodes reports whether s samples in the step being planned.
func (b *ContinuousBatcher) decodes(s *Sequence) bool {
	switch {
	case s.opening != nil:
		return false
	case b.samplesAhead(s):
		return b.decodesAhead(s)
	}
	return s.fed == len(s.feed)
}

// needsSync reports whether a running sequence's next step must see its
// last token first: a constrained sequence, or one with forced tokens
// to feed.
func (b *ContinuousBatcher) needsSync() bool {
	for _, e := range b.running {
		if s := e.Value; s.Constraint != nil || s.forced > 0 {
			return true
		}
	}
	return false
}

// openAsync sends s's Open without waiting for it when the model takes
// it so: a base-model generating sequence without a constraint.
func (b *ContinuousBatcher) openAsync(ctx context.Context, s *Sequence) bool {
	if b.piper == nil || s.Adapter != "" || s.Constraint != nil || len(s.Forced) > 0 {
		return false
	}
	p, ok := b.piper.OpenAsync(ctx, s.id, s.feed, s.PrefixKey)
	if !ok {
		return false
	}
	s.opening = p
	b.opening++
	return true
}

// resolveOpens reads the answers of the opens sent asynchronously. The
// engine answers them behind the step pending when they were sent, so
// after that step's delivery they are there or about to be.
func (b *ContinuousBatcher) resolveOpens(ctx context.Context) {
	b.readOrphans(ctx)
	if b.opening == 0 {
		return
	}
	kept := b.running[:0]
	for _, e := range b.running {
		s := e.Value
		if s.opening == nil {
			kept = append(kept, e)
			continue
		}
		reused, err := s.opening.Wait(ctx)
		s.opening = nil
		b.opening--
		if err != nil {
			b.free(s, "")
			b.openFailed(e, err, len(b.running)-1)
			continue
		}
		b.opened(s, reused)
		kept = append(kept, e)
	}
	clear(b.running[len(kept):])
	b.running = kept
}

// between is the batcher's own time before a step starting at start:
// from the last step's return (StepStats.Between).
func (b *ContinuousBatcher) between(start time.Time) time.Duration {
	if b.stepEnd.IsZero() {
		return 0
	}
	return start.Sub(b.stepEnd)
}

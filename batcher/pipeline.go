package batcher

import (
	"context"
	"errors"
	"slices"
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
	running         int // sequences running when it was sent
	sent            time.Time
	between         time.Duration
}

// stats is st's StepStats, delivered whole after latency.
func (st *sentStep) stats(latency time.Duration) StepStats {
	return StepStats{Batch: len(st.in), Decode: st.decode, PrefillTokens: st.prefill, Latency: latency, Between: st.between}
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
	st.blocks, st.running = 0, len(b.running)
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
		b.sentFailed(ctx, st, err, latency)
	} else {
		b.observe(st.stats(latency))
	}
	b.recycle(st)
	b.resolveOpens(ctx)
}

// sentFailed handles a sent step that failed, and the step sent behind
// it, if any, which it waits for. A step that changed nothing
// (engine.ErrNotRun, engine.ErrOutOfMemory) leaves its sequences to go
// on, preempting for blocks after a refusal as a synchronous step does; a
// step that ran in part (engine.PartialStepError) has what ran delivered
// and the rest goes on. The step behind such a step is delivered as far
// as it ran: the engine ran none of it on sequences left unchanged. After
// any other failure the sequences of both steps fail, unless the one
// behind changed nothing: it may have run on sequences the failed step
// fed. The next step is synchronous.
func (b *ContinuousBatcher) sentFailed(ctx context.Context, st *sentStep, err error, latency time.Duration) {
	b.syncNext = true
	if errors.Is(err, engine.ErrNotRun) {
		b.unsend(st.in, st.seqs)
		return // it changed nothing: its sequences go on
	}
	next := b.pend
	b.pend = nil
	var nouts []engine.StepOutput
	var nerr error
	if next != nil {
		nouts, nerr = next.p.Wait(ctx)
	}
	now := time.Now()
	left, ferr := b.settleSent(st, nil, err, now, latency)
	failed := st.in
	if next != nil {
		// As between two steps delivered in turn (deliverSent): st's
		// text is handed over before next's tokens (a stop in them
		// finishes the stream), and the opens whose first chunks ride
		// in next are answered, so that an Opening chunk delivered
		// counts from the prefix its open reused.
		b.flushText()
		b.resolveOpens(ctx)
		if ferr != nil && !unchanged(nerr) {
			b.unsend(next.in, next.seqs)
			failed = append(slices.Clip(st.in), next.in...)
		} else if _, nferr := b.settleSent(next, nouts, nerr, now, now.Sub(b.stepEnd)); nferr != nil {
			b.stepFailed(ctx, nferr, next.in)
		}
		b.recycle(next)
	}
	var part *engine.PartialStepError
	switch {
	case ferr != nil:
		b.stepFailed(ctx, ferr, failed)
	case errors.As(err, &part):
		b.leftInPart(ctx, part.Err, left)
	case b.pool != nil && len(b.running) == 1 && st.running > 1:
		// Refused whole for want of blocks while sequences it did not
		// feed held some (one that finished with the step before it,
		// its free sent behind it): they have left since, and the one
		// left steps again, as after a refusal of several.
		b.cfg.logger.Debug("engine out of blocks: preempting", "model", b.info.ID, "batch", len(st.in), "err", err)
		b.preemptRefused(st.in)
	default: // refused whole for want of memory
		b.stepFailed(ctx, err, st.in)
	}
}

// settleSent takes the outcome of sent step st, its outputs outs or its
// error err: what ran is delivered, and counted in the stats (latency:
// the step's), and what did not is taken back (unsend). It returns the inputs a step that ran in part left
// unchanged, and the error its sequences fail with when the step failed
// otherwise than by changing nothing.
func (b *ContinuousBatcher) settleSent(st *sentStep, outs []engine.StepOutput, err error, now time.Time, latency time.Duration) (left stepPart, failed error) {
	var part *engine.PartialStepError
	whole := st.stats(latency)
	switch {
	case err == nil:
		if err = b.deliver(st.in, st.seqs, outs, now); err == nil {
			b.refused = false
			b.observe(whole)
			return stepPart{}, nil
		}
	case errors.As(err, &part) && len(part.Ran) == len(st.in):
		b.count(&b.stats.PartialSteps)
		var done stepPart
		done, left = splitRan(st.in, st.seqs, part.Ran)
		if err = b.deliver(done.in, done.seqs, part.Outputs, now); err == nil {
			b.unsend(left.in, left.seqs)
			b.observe(ranStats(st.in, part.Ran, whole))
			return left, nil
		}
	case unchanged(err):
		b.unsend(st.in, st.seqs)
		return stepPart{}, nil
	}
	b.unsend(st.in, st.seqs) // deliver fails before it changes anything
	return stepPart{}, err
}

// unchanged reports whether err says a step changed no sequence.
func unchanged(err error) bool {
	return errors.Is(err, engine.ErrNotRun) || errors.Is(err, engine.ErrOutOfMemory)
}

// unsend takes back what undelivered inputs of a sent step counted on
// their sequences (seqs[i] the sequence of in[i]).
func (b *ContinuousBatcher) unsend(in []engine.StepInput, seqs []*Sequence) {
	for i := range in {
		if s := seqs[i]; s.open && s.id == in[i].Seq {
			n := in[i].Feeds()
			s.ahead = max(s.ahead-n, 0)
			if in[i].Opening && s.opening == nil {
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

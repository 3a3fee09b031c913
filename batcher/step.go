package batcher

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
)

// step builds one batch — a token for every decoding sequence first, then
// prompt chunks under what is left of the token budget — runs it, and hands
// the sampled tokens to their sequences. Nothing may be pending
// (pipeline.go).
func (b *ContinuousBatcher) step(ctx context.Context) {
	in, seqs, decode, prefill := b.plan()
	if len(in) == 0 {
		b.nothingToStep()
		return
	}
	b.run(ctx, in, seqs, decode, prefill)
}

// nothingToStep handles a plan with no input: the pending text work goes
// out, and on a paged model where every sequence waits for blocks, one
// is preempted to make some.
func (b *ContinuousBatcher) nothingToStep() {
	b.flushText()
	if b.pool != nil && len(b.running) > 1 {
		b.preemptForBlocks()
	}
}

// run runs a planned step and hands the sampled tokens to their
// sequences.
func (b *ContinuousBatcher) run(ctx context.Context, in []engine.StepInput, seqs []*Sequence, decode, prefill int) {
	start := time.Now()
	between := b.between(start)
	text := b.textBehind()
	outs, err := b.model.Step(ctx, in)
	elapsed := time.Since(start)
	b.stepEnd = start.Add(elapsed)
	text()
	whole := StepStats{Batch: len(in), Decode: decode, PrefillTokens: prefill, Latency: elapsed, Between: between}
	var part *engine.PartialStepError
	if errors.As(err, &part) {
		b.ranInPart(ctx, in, seqs, part, b.stepEnd, whole)
		return
	}
	if err != nil {
		b.stepFailed(ctx, err, in)
		return
	}
	if err := b.deliver(in, seqs, outs, start.Add(elapsed)); err != nil {
		b.stepFailed(ctx, err, in)
		return
	}
	b.refused = false
	b.observe(whole)
}

// plan builds the next step's batch into b.inputs and b.stepSeqs: a token
// for every decoding sequence first, then prompt chunks under what is
// left of the token budget. Behind a pending step (pipeline.go) a
// sequence that samples in it feeds that sample (engine.StepInput.Prev)
// and prompt chunks go on from where the pending step leaves them.
func (b *ContinuousBatcher) plan() (in []engine.StepInput, seqs []*Sequence, decode, prefill int) {
	// A delivery since the loop's top (an admission that waited for the
	// pending step) may have fed a sequence cancelled meanwhile its last
	// prompt chunk with no token sampled: it must not step again.
	b.reapCancelled()
	in, seqs = b.inputs[:0], b.stepSeqs[:0]
	budget := b.cfg.tokenBudget
	dead := false
	blocks := 0 // blocks left for prompt chunks on a paged model
	if b.pool != nil {
		blocks = b.roomForDecodes()
	}
	b.fillMasks()
	generating := false // a generating (not embedding) sequence runs
	for _, e := range b.running {
		s := e.Value
		generating = generating || s.Pool == engine.PoolNone
		switch {
		case s.opening != nil:
		case b.samplesAhead(s):
			if b.decodesAhead(s) {
				// Its token in the pending step is not in generated yet.
				in = append(in, engine.StepInput{Seq: s.id, Prev: true, Sample: true, Params: &s.params, Last: b.budget(s) <= 2})
				seqs = append(seqs, s)
				budget--
				decode++
			}
		case s.fed == len(s.feed):
			allowed, ok := b.allowed(s)
			if !ok {
				dead = true
				continue
			}
			// The last sampled token, and the tokens jump-forward
			// appended after it.
			in = append(in, engine.StepInput{Seq: s.id, Tokens: s.generated[len(s.generated)-1-s.forced:], Sample: true, Params: &s.params, Allowed: allowed, Last: b.budget(s) <= 1})
			if allowed != nil && s.loopLeft > 0 {
				in[len(in)-1].Loop, in[len(in)-1].LoopSteps = s.loop, s.loopLeft
			}
			seqs = append(seqs, s)
			budget -= 1 + s.forced
			decode++
		}
	}
	// Prompt chunks: generating sequences' first, as their time to first
	// token waits on them; then embedding inputs, which take at most their
	// share of the budget while generating sequences run, and while
	// sequences decode join every other step only (a flood of embeddings
	// would otherwise fill every step and make each decode pay a prefill
	// step's time).
	embedded := false
	for _, pooled := range []bool{false, true} {
		room := budget
		if pooled && generating {
			room = min(budget, b.embedRoom())
		}
		if pooled && decode > 0 && b.embedded {
			room = 0
		}
		for _, e := range b.running {
			s := e.Value
			fed := s.fed + s.ahead // where the pending step leaves the feed
			if (s.Pool != engine.PoolNone) != pooled || fed >= len(s.feed) || room <= 0 || (s.opening != nil && s.ahead > 0) {
				continue // an open not answered yet takes its first chunk only
			}
			n := min(room, len(s.feed)-fed)
			if pooled && b.info.Encoder {
				// An encoder reads its input whole; alone in a step it
				// may exceed the budget.
				if n = len(s.feed) - fed; n > room && len(in) > 0 {
					continue
				}
			}
			if b.pool != nil && len(b.running) > 1 {
				if n = b.chunkForBlocks(s, n, blocks); n == 0 {
					continue // waits for blocks; decodes free them
				}
				blocks -= b.grows(s, n)
			}
			end := fed + n
			var allowed []uint64
			if end == len(s.feed) {
				var ok bool
				if allowed, ok = b.allowed(s); !ok {
					dead = true
					continue
				}
			}
			sample := end == len(s.feed)
			in = append(in, engine.StepInput{Seq: s.id, Tokens: s.feed[fed:end], Sample: sample, Params: &s.params, Allowed: allowed, Opening: s.opening != nil,
				Last: sample && s.Pool == engine.PoolNone && b.budget(s) <= 1})
			seqs = append(seqs, s)
			budget -= n
			room -= n
			prefill += n
			embedded = embedded || pooled
		}
	}
	b.embedded = embedded
	b.inputs, b.stepSeqs = in, seqs
	if dead {
		b.removeFinished()
	}
	return in, seqs, decode, prefill
}

// deliver advances every input's sequence and appends the sampled tokens.
// seqs[i] is the sequence of in[i].
func (b *ContinuousBatcher) deliver(in []engine.StepInput, seqs []*Sequence, outs []engine.StepOutput, now time.Time) error {
	j := 0
	for i := range in {
		if in[i].Sample {
			if j >= len(outs) || outs[j].Seq != in[i].Seq {
				return fmt.Errorf("engine returned outputs that do not match the batch's sampling inputs (%d outputs)", len(outs))
			}
			if seqs[i].Pool != engine.PoolNone && len(outs[j].Embedding) != b.info.EmbedDim {
				return fmt.Errorf("engine returned %d values for sequence %d's embedding; the model's EmbedDim is %d", len(outs[j].Embedding), in[i].Seq, b.info.EmbedDim)
			}
			j++
		}
	}
	if j != len(outs) {
		return fmt.Errorf("engine returned %d outputs for %d sampling inputs", len(outs), j)
	}
	j = 0
	finished := false
	for i := range in {
		s := seqs[i]
		if !s.open || s.id != in[i].Seq {
			// It finished, was cancelled or preempted after the step
			// was sent (pipeline.go): the row's output is not its.
			if in[i].Sample {
				j++
			}
			continue
		}
		n := in[i].Feeds()
		s.kv += n
		s.ahead = max(s.ahead-n, 0)
		if s.fed < len(s.feed) {
			s.fed += n
		}
		if !in[i].Sample {
			continue
		}
		s.forced = 0            // fed
		if s.cancelled.Load() { // cancelled during the step: reaped next
			j++
			continue
		}
		if s.Pool != engine.PoolNone {
			b.pooled(s, outs[j], now)
			finished = true
		} else if b.accept(s, outs[j], now) {
			finished = true
		}
		j++
	}
	if finished {
		b.removeFinished()
	}
	return nil
}

// accept appends one sampled token, emits it, and finishes the sequence
// when a stop condition holds. It reports whether the sequence finished.
func (b *ContinuousBatcher) accept(s *Sequence, out engine.StepOutput, now time.Time) bool {
	if s.firstToken.IsZero() {
		s.firstToken = now
	}
	if !s.resumedFrom.IsZero() {
		b.resumed(s, now)
	}
	s.lastToken = now
	c := api.Chunk{Token: out.Token, HasToken: true, Logprob: out.Logprob}
	if len(out.Top) > 0 {
		c.Top = make([]api.TopLogprob, len(out.Top))
		for i, e := range out.Top {
			c.Top[i] = api.TopLogprob{Token: e.Token, Logprob: e.Logprob}
		}
	}
	if b.emit(s, c, now) {
		return true
	}
	return b.cfg.jumpForward && b.jumpForward(s, now)
}

// pooled finishes embedding sequence s with its vector.
func (b *ContinuousBatcher) pooled(s *Sequence, out engine.StepOutput, now time.Time) {
	s.firstToken, s.lastToken = now, now
	s.Watch.Token()
	b.free(s, "")
	u := s.usage(now)
	s.out.finish(api.Chunk{Embedding: out.Embedding, Finish: api.FinishStop, Usage: u}, nil)
}

// jumpForward appends the tokens s's constraint forces after the token
// just accepted, within the sequence's max tokens, its context and the
// step budget; they are fed with the next step. It reports whether the
// sequence finished.
func (b *ContinuousBatcher) jumpForward(s *Sequence, now time.Time) bool {
	f, ok := s.Constraint.(Forcer)
	if !ok || s.Params.Logprobs || s.Params.TopLogprobs > 0 {
		return false // forced tokens have no log-probabilities to report
	}
	room := min(b.budget(s), b.cfg.tokenBudget-1)
	if room <= 0 {
		return false
	}
	forced := f.ForcedTokens
	if c, ok := s.Constraint.(Closer); ok && !s.KeepCut {
		forced = func(max int) []int32 { return c.ForcedTokensWithin(max, b.budget(s)) }
	}
	for _, tok := range forced(room) {
		s.forced++
		s.forcedTotal++
		if b.emit(s, api.Chunk{Token: tok, HasToken: true}, now) {
			return true
		}
	}
	return false
}

// emit appends one token to s, sampled or forced, hands its chunk c to
// the reader, and finishes the sequence when a stop condition holds. It
// reports whether the sequence finished.
func (b *ContinuousBatcher) emit(s *Sequence, c api.Chunk, now time.Time) bool {
	tok := c.Token
	s.generated = append(s.generated, tok)
	s.Watch.Token()
	if b.isStopToken(s, tok) {
		b.finish(s, api.FinishStop, "", now)
		return true
	}
	if s.Constraint != nil {
		// The mask stays while the tokens accepted are in the loop.
		s.maskKept = s.loopLeft > 0 && engine.MaskAllows(s.loop, tok)
		if s.maskKept {
			s.loopLeft--
		} else {
			s.loopLeft = 0
		}
		if err := s.Constraint.Accept(tok); err != nil {
			b.free(s, "")
			s.out.finish(api.Chunk{}, fmt.Errorf("model %s: the engine sampled a token the constraint does not allow: %w", b.info.ID, err))
			return true
		}
	}
	if s.pendingText {
		b.flushText() // its earlier chunk first (forced tokens emit several at once)
	}
	if !b.cfg.serialText && s.Constraint == nil && b.budget(s) > 0 && neverStops(s.Text) && len(s.generated) > 1 {
		// Nothing the next step needs waits on this token's text: it is
		// detokenized and handed over behind the next step. Not a
		// sequence's first token, which its reader waits for longest.
		s.pendingText = true
		b.pending = append(b.pending, pendingChunk{s, c})
		return false
	}
	if s.Text != nil {
		delta, stopped := s.Text.Add(tok)
		c.Text = delta
		if stopped {
			s.out.push(c)
			b.finish(s, api.FinishStop, "", now)
			return true
		}
	}
	s.out.push(c)
	if s.Constraint != nil && s.Constraint.Done() {
		tail := ""
		if s.Text != nil {
			tail = s.Text.Flush()
		}
		reason := api.FinishStop
		if s.closingAt > 0 {
			reason = api.FinishLength // the budget closed the output
		}
		b.finish(s, reason, tail, now)
		return true
	}
	if b.budget(s) <= 0 {
		tail := ""
		if s.Text != nil {
			tail = s.Text.Flush()
		}
		b.finish(s, api.FinishLength, tail, now)
		return true
	}
	return false
}

func (b *ContinuousBatcher) isStopToken(s *Sequence, tok int32) bool {
	if !s.IgnoreEOS && slices.Contains(b.info.EOS, tok) {
		return true
	}
	return slices.Contains(s.StopTokens, tok)
}

// finish frees a sequence (saving its KV under SaveKey) and sends its final
// chunk. The caller removes it from running.
func (b *ContinuousBatcher) finish(s *Sequence, reason api.FinishReason, text string, now time.Time) {
	b.free(s, s.SaveKey)
	s.out.finish(api.Chunk{Text: text, Finish: reason, Usage: s.usage(now)}, nil)
}

func (s *Sequence) usage(now time.Time) *api.Usage {
	u := &api.Usage{
		PromptTokens:     len(s.Prompt),
		CompletionTokens: len(s.generated),
		ForcedTokens:     s.forcedTotal,
		ClosingTokens:    s.closingTokens(),
		CachedTokens:     s.cached,
		QueueWait:        s.admitted.Sub(s.Submitted),
		Duration:         now.Sub(s.Submitted),
		Preemptions:      s.preemptions,
		Resumes:          s.resumes,
		ResumeGap:        s.resumeGap,
	}
	if !s.firstToken.IsZero() {
		u.TimeToFirstToken = s.firstToken.Sub(s.Submitted)
	}
	return u
}

// removeFinished drops sequences that are no longer open from running.
func (b *ContinuousBatcher) removeFinished() {
	kept := b.running[:0]
	for _, e := range b.running {
		if e.Value.open {
			kept = append(kept, e)
		}
	}
	clear(b.running[len(kept):])
	b.running = kept
}

// stepFailed handles a failed Step. Every sequence of the batch is treated
// as failed (the contract says its KV is undefined) and goes to
// retryOrFail: retried or resumed when the retry policy allows.
func (b *ContinuousBatcher) stepFailed(ctx context.Context, err error, in []engine.StepInput) {
	if ctx.Err() != nil {
		return // closing: the loop fails what is running
	}
	if b.pool != nil && errors.Is(err, engine.ErrOutOfMemory) && len(b.running) > 1 {
		// A refused step changed no sequence (engine.BlockPool): the
		// pool is shorter than the batcher counted (blocks held ahead
		// by the engine, or workers' pools of different fill). Give
		// blocks back and step again.
		b.cfg.logger.Debug("engine out of blocks: preempting", "model", b.info.ID, "batch", len(in), "err", err)
		b.preemptRefused(in)
		return
	}
	b.cfg.logger.Warn("engine step failed", "model", b.info.ID, "err", err, "batch", len(in), "retryable", b.cfg.retry.Retryable(err))
	failed := make(map[engine.SeqID]bool, len(in))
	for i := range in {
		failed[in[i].Seq] = true
	}
	kept := b.running[:0]
	for _, e := range b.running {
		s := e.Value
		if !failed[s.id] {
			kept = append(kept, e)
			continue
		}
		b.release(e, "")
		b.retryOrFail(e, fmt.Errorf("model %s: %w", b.info.ID, err))
	}
	clear(b.running[len(kept):])
	b.running = kept
}

// allowed fills a constrained sequence's mask for its next sample. When
// the constraint allows no token (its limits leave no way to complete
// the output) the sequence ends with FinishLength, keeping the valid
// prefix, and ok is false.
func (b *ContinuousBatcher) allowed(s *Sequence) (mask []uint64, ok bool) {
	if s.Constraint == nil {
		return nil, true
	}
	if !s.maskReady {
		b.fillMask(s)
	}
	s.maskReady = false
	for _, w := range s.mask {
		if w != 0 {
			return s.mask, true
		}
	}
	tail := ""
	if s.Text != nil {
		tail = s.Text.Flush()
	}
	b.finish(s, api.FinishLength, tail, time.Now())
	return nil, false
}

// fillMasks computes the masks of the constrained sequences that sample
// this step, on up to GOMAXPROCS goroutines: each sequence's constraint is
// its own, and grammar vocabularies are safe for concurrent use. The
// goroutines end before it returns.
func (b *ContinuousBatcher) fillMasks() {
	todo := b.maskSeqs[:0]
	for _, e := range b.running {
		if s := e.Value; s.Constraint != nil && s.fed == len(s.feed) {
			todo = append(todo, s)
		}
	}
	b.maskSeqs = todo
	workers := min(len(todo), runtime.GOMAXPROCS(0))
	if workers <= 1 {
		for _, s := range todo {
			b.fillMask(s)
		}
		return
	}
	var next atomic.Int32
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(todo) {
					return
				}
				b.fillMask(todo[i])
			}
		})
	}
	wg.Wait()
	clear(todo)
}

// fillMask computes s's mask and loop for its next sample, or keeps the
// mask when the tokens accepted since it was computed stayed in its loop
// (with steps of the loop left to pass on).
func (b *ContinuousBatcher) fillMask(s *Sequence) {
	s.maskReady = true
	if s.mask != nil && s.maskKept && s.loopLeft > 0 {
		s.maskKept = false
		return
	}
	s.maskKept = false
	if s.mask == nil {
		s.mask = make([]uint64, engine.MaskWords(b.info.VocabSize))
	}
	slack := -1 // no limit on the loop
	if c, ok := s.Constraint.(Closer); ok && !s.KeepCut {
		var cut bool
		slack, cut = c.FillMaskWithin(s.mask, b.budget(s))
		if cut && s.closingAt == 0 {
			s.closingAt = 1 + len(s.generated)
		}
	} else {
		s.Constraint.FillMask(s.mask)
	}
	s.loopLeft = 0
	if l, ok := s.Constraint.(Looper); ok && slack != 0 {
		if s.loop == nil {
			s.loop = make([]uint64, engine.MaskWords(b.info.VocabSize))
		}
		s.loopLeft = l.Loop(s.loop)
		if slack > 0 {
			// Tokens decoded ahead stay where the mask cannot change.
			s.loopLeft = min(s.loopLeft, slack)
		}
	}
}

// embedRoom is the most tokens embedding inputs take in a step while
// generating sequences run (WithEmbedShare), at least one.
func (b *ContinuousBatcher) embedRoom() int {
	return max(1, int(float64(b.cfg.tokenBudget)*b.cfg.embedShare))
}

// budget is how many more tokens s may generate: what is left of its
// MaxTokens and of the model's context.
func (b *ContinuousBatcher) budget(s *Sequence) int {
	return min(s.MaxTokens-len(s.generated), b.info.ContextLength-len(s.Prompt)-len(s.generated))
}

// closingTokens is how many tokens s generated from the first mask its
// budget restricted on (Closer).
func (s *Sequence) closingTokens() int {
	if s.closingAt == 0 {
		return 0
	}
	return len(s.generated) + 1 - s.closingAt
}

// pendingChunk is a token's chunk whose text work runs behind the next
// step (WithTextBehindStep).
type pendingChunk struct {
	s *Sequence
	c api.Chunk
}

// neverStops reports whether a sequence's detokenizer can never report a
// stop (it has no stop strings), so its text work may wait.
func neverStops(d Detokenizer) bool {
	if d == nil {
		return true
	}
	n, ok := d.(interface{ NeverStops() bool })
	return ok && n.NeverStops()
}

// text detokenizes a pending chunk's token and hands the chunk over.
func (p pendingChunk) text() {
	p.s.pendingText = false
	if p.s.Text != nil {
		p.c.Text, _ = p.s.Text.Add(p.c.Token) // never stops: neverStops
	}
	p.s.out.push(p.c)
}

// textBehind starts the pending text work in a goroutine, to run while
// the engine steps; the function it returns waits for it. Only that
// goroutine touches the pending sequences' detokenizers and readers
// meanwhile: the loop is inside the engine's Step.
func (b *ContinuousBatcher) textBehind() (wait func()) {
	if len(b.pending) == 0 {
		return func() {}
	}
	work := b.pending
	b.pending = b.pendingSpare[:0]
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, p := range work {
			p.text()
		}
	}()
	return func() {
		<-done
		clear(work)
		b.pendingSpare = work[:0]
	}
}

// flushText runs the pending text work now: before a sequence with a
// pending chunk leaves the running set (preempted, cancelled, failed) and
// when no step follows to run it behind.
func (b *ContinuousBatcher) flushText() {
	for _, p := range b.pending {
		p.text()
	}
	clear(b.pending)
	b.pending = b.pending[:0]
}

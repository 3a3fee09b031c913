package batcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

// Steps run in part. An engine that splits a batch across workers, each
// with its own KV pool, may run a step on the workers with room while
// another, short of blocks, leaves its inputs unchanged
// (engine.PartialStepError): the batcher plans with the pools' sum
// (engine.BlockPool), which can have room while one worker has none. The
// tokens of the inputs that ran are delivered; the others step again,
// after one of their sequences is preempted to give that worker blocks.
// Reading such a step as refused (ErrOutOfMemory: nothing changed) would
// feed the sequences that ran the same tokens again.

// stepPart is some of a step's inputs, with their sequences.
type stepPart struct {
	in   []engine.StepInput
	seqs []*Sequence
}

// splitRan splits a step's inputs (seqs[i] the sequence of in[i]) into
// those that ran and those that did not, as ran says.
func splitRan(in []engine.StepInput, seqs []*Sequence, ran []bool) (done, left stepPart) {
	for i := range in {
		p := &left
		if ran[i] {
			p = &done
		}
		p.in, p.seqs = append(p.in, in[i]), append(p.seqs, seqs[i])
	}
	return done, left
}

// ranInPart handles a step that ran some of its inputs only
// (engine.PartialStepError: one worker of several left its part
// unchanged): those that ran are delivered, and the others step again.
func (b *ContinuousBatcher) ranInPart(ctx context.Context, in []engine.StepInput, seqs []*Sequence, part *engine.PartialStepError, now time.Time, whole StepStats) {
	if len(part.Ran) != len(in) {
		b.stepFailed(ctx, fmt.Errorf("engine reported %d inputs of a partial step; the batch has %d: %w", len(part.Ran), len(in), part), in)
		return
	}
	b.count(&b.stats.PartialSteps)
	done, left := splitRan(in, seqs, part.Ran)
	if err := b.deliver(done.in, done.seqs, part.Outputs, now); err != nil {
		b.stepFailed(ctx, err, in)
		return
	}
	b.observe(ranStats(in, part.Ran, whole))
	b.leftInPart(ctx, part.Err, left)
}

// ranStats is the StepStats of the inputs of a step that ran, as ran
// says: whole's latency and gap, its batch, decode inputs (the first
// whole.Decode, as plan puts them) and prompt tokens counted over those
// inputs only.
func ranStats(in []engine.StepInput, ran []bool, whole StepStats) StepStats {
	st := StepStats{Latency: whole.Latency, Between: whole.Between}
	for i := range in {
		switch {
		case !ran[i]:
		case i < whole.Decode:
			st.Batch++
			st.Decode++
		default:
			st.Batch++
			st.PrefillTokens += len(in[i].Tokens)
		}
	}
	return st
}

// leftInPart handles the inputs a step that ran in part left unchanged
// for err. They step again; after a refusal for want of blocks one of
// their sequences is first preempted, giving its blocks back to the
// worker that refused (the others had room). On a model that does not
// page they fail, as after a whole step refused so.
func (b *ContinuousBatcher) leftInPart(ctx context.Context, err error, left stepPart) {
	switch {
	case !errors.Is(err, engine.ErrOutOfMemory) || len(b.running) <= 1:
	case b.pool == nil:
		b.stepFailed(ctx, err, left.in)
	default:
		b.cfg.logger.Debug("engine out of blocks: preempting", "model", b.info.ID, "refused", len(left.in), "err", err)
		b.preemptRefused(left.in)
	}
}

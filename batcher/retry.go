package batcher

import (
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// retryOrFail decides the fate of a sequence whose attempt failed with err
// (its KV already released). An error the policy does not retry ends the
// stream as is. Otherwise, when the retry policy allows, the sequence is
// requeued after the policy's wait and runs again on a live worker:
// before its first token from its prompt, after tokens reached the caller
// by resuming — its prompt then is the original prompt plus every token
// delivered, as after a preemption, so the stream goes on where it stopped
// with nothing repeated or lost (see resumable). A sequence that cannot
// resume exactly fails with a *retry.InterruptedError. It reports whether
// it was requeued.
func (b *ContinuousBatcher) retryOrFail(e *Entry, err error) bool {
	s := e.Value
	if !b.cfg.retry.Retryable(err) {
		s.out.finish(api.Chunk{}, err)
		return false
	}
	n := len(s.generated)
	if n > 0 && !b.resumable(&s.Params) {
		s.out.finish(api.Chunk{}, &retry.InterruptedError{Delivered: n, Err: err})
		return false
	}
	if s.retries == nil {
		s.retries = b.cfg.retry.Start()
	}
	wait, ok := s.retries.Next(err)
	if !ok {
		if s.retries.Attempts() > 1 {
			err = &retry.ExhaustedError{Attempts: s.retries.Attempts(), Err: err}
		}
		s.out.finish(api.Chunk{}, err)
		return false
	}
	s.preemptions++
	if n > 0 {
		b.count(&b.stats.Resumed)
		s.resumes++
		if s.resumedFrom.IsZero() { // not lost again before a token followed
			s.resumedFrom = s.lastToken
		}
		b.cfg.logger.Info("resuming sequence", "model", b.info.ID, "delivered", n, "attempt", s.retries.Attempts()+1, "after", wait, "err", err)
	} else {
		b.cfg.logger.Info("retrying sequence", "model", b.info.ID, "attempt", s.retries.Attempts()+1, "after", wait, "err", err)
	}
	b.requeueAfter(e, wait)
	return true
}

// resumable reports whether a sequence recomputed from its prompt plus the
// tokens it delivered continues exactly as it would have. It does on a
// model that reports engine.Info.Resumes: the batcher sets
// SamplingParams.Generated, and the engine continues seeded draws at that
// position and counts those tokens for presence and frequency penalties.
// On other models only greedy decoding and sampling that draws from no
// seeded generator and keeps no count of generated tokens continue
// exactly (repetition penalties count the whole sequence); the rest fail
// instead.
func (b *ContinuousBatcher) resumable(p *engine.SamplingParams) bool {
	if b.info.Resumes {
		return true
	}
	if p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
		return false
	}
	return p.Temperature == 0 || !p.HasSeed
}

// resumed accounts for the first token of a resumed sequence, produced
// at now, before it is appended.
func (b *ContinuousBatcher) resumed(s *Sequence, now time.Time) {
	gap := now.Sub(s.resumedFrom)
	s.resumeGap += gap
	s.resumedFrom = time.Time{}
	s.retries.Reset() // it made progress: a later loss is a new failure with the policy's full attempts
	if b.cfg.onResume != nil {
		b.cfg.onResume(ResumeStats{Cause: ResumeWorkerLost, Delivered: len(s.generated), Gap: gap})
	}
}

// requeueAfter puts e back in the queue after d. The timer is owned by the
// batcher: the loop's exit stops it and fails the sequence.
func (b *ContinuousBatcher) requeueAfter(e *Entry, d time.Duration) {
	if d <= 0 {
		b.queue.Requeue(e)
		return
	}
	b.delayMu.Lock()
	defer b.delayMu.Unlock()
	if b.delayed == nil {
		b.delayed = make(map[*Entry]*time.Timer)
	}
	b.delayed[e] = time.AfterFunc(d, func() {
		b.delayMu.Lock()
		_, mine := b.delayed[e]
		delete(b.delayed, e)
		b.delayMu.Unlock()
		switch {
		case !mine: // the loop exited and failed it
		case e.Value.cancelled.Load():
			e.Value.out.finish(api.Chunk{}, e.Value.out.cancelError())
		default:
			b.queue.Requeue(e)
		}
	})
}

// waitingRetries is the number of sequences waiting to be requeued.
func (b *ContinuousBatcher) waitingRetries() int {
	b.delayMu.Lock()
	defer b.delayMu.Unlock()
	return len(b.delayed)
}

// failDelayed ends the sequences still waiting to be requeued.
func (b *ContinuousBatcher) failDelayed(err error) {
	b.delayMu.Lock()
	defer b.delayMu.Unlock()
	for e, t := range b.delayed {
		t.Stop()
		e.Value.out.finish(api.Chunk{}, err)
		delete(b.delayed, e)
	}
}

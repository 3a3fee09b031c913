package batcher

import (
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/retry"
)

// retryOrFail decides the fate of a sequence whose attempt failed with err
// (its KV already released). An error the policy does not retry ends the
// stream as is. A sequence that produced a token is never retried: the
// caller has it, and a new attempt would repeat it, so the stream fails
// with a *retry.InterruptedError. Otherwise, when the retry
// policy allows, it is requeued after the policy's wait and starts again
// from its prompt; greedy and seeded requests then produce exactly the
// tokens the lost attempt would have. It reports whether it was requeued.
func (b *ContinuousBatcher) retryOrFail(e *Entry, err error) bool {
	s := e.Value
	if !b.cfg.retry.Retryable(err) {
		s.out.finish(api.Chunk{}, err)
		return false
	}
	if n := len(s.generated); n > 0 {
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
	b.cfg.logger.Info("retrying sequence", "model", b.info.ID, "attempt", s.retries.Attempts()+1, "after", wait, "err", err)
	b.requeueAfter(e, wait)
	return true
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

package session

import (
	"context"

	"github.com/mlxserving/mlxserving/engine"
)

var _ engine.Pipeliner = (*PrefixCache)(nil)

// StepAsync sends the batch to the wrapped model when it pipelines
// (engine.Pipeliner); ok is false when it does not. What each sequence
// was fed is hashed when the step's Wait returns: a Prev input's token is
// the one its sequence sampled in the step before, which that step's Wait
// returned first.
func (c *PrefixCache) StepAsync(ctx context.Context, batch []engine.StepInput) (engine.PendingStep, bool, error) {
	pl, ok := c.m.(engine.Pipeliner)
	if !ok {
		return nil, false, nil
	}
	p, ok, err := pl.StepAsync(ctx, batch)
	if !ok || err != nil {
		return nil, ok, err
	}
	return &cachedStep{c: c, p: p, batch: batch}, true, nil
}

// cachedStep is a step the wrapped model runs ahead; the batch is the
// caller's, which it does not change before Wait.
type cachedStep struct {
	c     *PrefixCache
	p     engine.PendingStep
	batch []engine.StepInput
}

// Wait returns the wrapped step's outputs, after hashing what each
// sequence was fed and noting what each sampled: of every input, or of
// those that ran when the step ran in part (engine.PartialStepError).
func (s *cachedStep) Wait(ctx context.Context) ([]engine.StepOutput, error) {
	out, err := s.p.Wait(ctx)
	ran, outs, ok := stepRan(out, err)
	if !ok {
		return out, err
	}
	c := s.c
	for i := range s.batch {
		in := &s.batch[i]
		h := c.seqs[in.Seq]
		if h == nil || (ran != nil && !ran[i]) {
			continue // freed while the step was pending, or not run
		}
		switch {
		case in.Prev:
			c.one[0] = c.last[in.Seq]
			h.Write(c.one[:])
		case in.Opening: // the feed from its start: the reused prefix is hashed already
			h.Write(in.Tokens[min(h.Tokens(), len(in.Tokens)):])
		default:
			h.Write(in.Tokens)
		}
	}
	for i := range outs {
		if c.seqs[outs[i].Seq] != nil {
			c.last[outs[i].Seq] = outs[i].Token
		}
	}
	return out, err
}

// OpenAsync is Open sent to the wrapped model without waiting, when it
// pipelines: the key is chosen now, the index learns what the engine
// reused at Wait.
func (c *PrefixCache) OpenAsync(ctx context.Context, id engine.SeqID, prompt []int32, key string) (engine.PendingOpen, bool) {
	pl, ok := c.m.(engine.Pipeliner)
	if !ok {
		return nil, false
	}
	chosen, predicted := c.lookup(prompt, key, "")
	p, ok := pl.OpenAsync(ctx, id, prompt, chosen)
	if !ok {
		return nil, false
	}
	c.opening[id] = struct{}{}
	return &cachedOpen{c: c, p: p, id: id, prompt: prompt, chosen: chosen, predicted: predicted}, true
}

// cachedOpen is an open the wrapped model answers later.
type cachedOpen struct {
	c         *PrefixCache
	p         engine.PendingOpen
	id        engine.SeqID
	prompt    []int32
	chosen    string
	predicted int
}

// Wait returns what the wrapped open reused, recording it as Open does.
func (o *cachedOpen) Wait(ctx context.Context) (int, error) {
	r, err := o.p.Wait(ctx)
	c := o.c
	if _, live := c.opening[o.id]; !live {
		return r, err // freed before the answer
	}
	delete(c.opening, o.id)
	if err != nil {
		return r, err
	}
	c.opened(o.id, o.prompt, "", o.chosen, o.predicted, r)
	return r, nil
}

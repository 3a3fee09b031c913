package batcher

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/api"
)

// Withdrawer is the part of a queue a [Source] needs: a waiting entry can
// be taken out, and put back at another tier. The priority scheduler
// implements it.
type Withdrawer interface {
	// Remove takes e out of the queue; false if it is not queued.
	Remove(e *Entry) bool
	// Requeue puts e back.
	Requeue(e *Entry)
}

// SourceHooks let the program serving a [Source] observe its stream. Every
// field is optional; a nil func is not called.
type SourceHooks struct {
	// Gap receives the time between two consecutive tokens.
	Gap func(time.Duration)
	// TokenText gives a token's text, for the alternatives of a chunk's
	// top log-probabilities; nil leaves their Text empty.
	TokenText func(id int32) string
	// End is called once, when the reader sees the stream end: with the
	// final usage, or with the error that ended it.
	End func(u *api.Usage, err error)
	// Resumed is the number of api.Params.Resume tokens the sequence was
	// fed after its prompt: the final usage counts them as generated.
	Resumed int
}

// Source is an [api.Source] over one queued sequence: it reads the
// sequence's chunks and, when the caller stops or ctx ends, cancels the
// sequence (removing it from the queue, or having the batcher free it
// before its next step).
type Source struct {
	entry     *Entry
	queue     Withdrawer
	hooks     SourceHooks
	stopAfter func() bool
	closeOnce sync.Once

	// Owned by the reader.
	lastToken time.Time
	ended     bool
}

// NewSource returns the source of e, which has been pushed onto q. The
// sequence is cancelled with ctx's cause when ctx ends.
func NewSource(ctx context.Context, e *Entry, q Withdrawer, hooks SourceHooks) *Source {
	src := &Source{entry: e, queue: q, hooks: hooks}
	// An already-ended ctx runs the func at once, on another goroutine:
	// it waits until stopAfter is set, which Close calls.
	set := make(chan struct{})
	src.stopAfter = context.AfterFunc(ctx, func() {
		<-set
		src.Close(context.Cause(ctx))
	})
	close(set)
	return src
}

// Close stops the sequence: its stream ends at once; a queued one is
// removed, a running one is freed by the batcher at its next step boundary.
func (s *Source) Close(err error) {
	s.closeOnce.Do(func() {
		s.stopAfter()
		s.entry.Value.Watch.Stop()
		Expire(s.queue, s.entry, err)
	})
}

// Expire ends the stream of e, pushed onto q, with err at once: a queued
// sequence is removed, a running one (maybe inside a long step) is freed
// by the batcher at the step's end. A deadline's Watch calls it directly.
func Expire(q Withdrawer, e *Entry, err error) {
	seq := e.Value
	seq.Cancel(err)
	q.Remove(e)
	// Answer the caller now, also while the sequence is inside a step (a
	// long prefill): the batcher frees it at the step's end.
	seq.Fail(err)
}

// Raise moves a sequence still waiting in the queue to a more urgent tier
// (request merging calls it when a more urgent request joins). A running
// sequence keeps its tier.
func (s *Source) Raise(t api.Tier) {
	if !t.Outranks(s.entry.Value.Tier) || !s.queue.Remove(s.entry) {
		return
	}
	// Out of the queue and not admitted: nothing else reads the entry.
	s.entry.Tier, s.entry.Value.Tier = t, t
	s.queue.Requeue(s.entry)
}

// Recv returns the sequence's next chunk; see api.Source.
func (s *Source) Recv(ctx context.Context) (api.Chunk, error) {
	c, err := s.entry.Value.Recv(ctx)
	switch {
	case err == nil:
		c = s.observe(c)
		if text := s.hooks.TokenText; text != nil {
			for i := range c.Top {
				c.Top[i].Text = text(c.Top[i].Token)
			}
		}
		return c, nil
	case errors.Is(err, ErrStreamDone):
		s.stopAfter()
		s.entry.Value.Watch.Stop()
		return api.Chunk{}, io.EOF
	case ctx.Err() != nil:
		s.Close(context.Cause(ctx))
		s.end(nil, ctx.Err())
		return api.Chunk{}, ctx.Err()
	default:
		s.stopAfter()
		s.entry.Value.Watch.Stop()
		s.end(nil, err)
		return api.Chunk{}, err
	}
}

// observe reports token timing and, on the final chunk, the end, whose
// usage it returns counting the resumed tokens as generated.
func (s *Source) observe(c api.Chunk) api.Chunk {
	if c.HasToken {
		now := time.Now()
		if !s.lastToken.IsZero() && s.hooks.Gap != nil {
			s.hooks.Gap(now.Sub(s.lastToken))
		}
		s.lastToken = now
	}
	if c.Finish != "" {
		if c.Usage != nil && s.hooks.Resumed > 0 {
			u := *c.Usage
			u.PromptTokens -= s.hooks.Resumed
			u.CompletionTokens += s.hooks.Resumed
			c.Usage = &u
		}
		s.end(c.Usage, nil)
	}
	return c
}

// end reports the stream's end once.
func (s *Source) end(u *api.Usage, err error) {
	if s.ended {
		return
	}
	s.ended = true
	if s.hooks.End != nil {
		s.hooks.End(u, err)
	}
}

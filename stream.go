package mlxserving

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
)

// localSource is an api.Source over one sequence of a model's batcher: it
// reads the sequence's chunks, records their timing and, when the caller
// stops, cancels the sequence (removing it from the queue, or freeing it
// from the batch before the next step).
type localSource struct {
	model     *model
	entry     *batcher.Entry
	metrics   *metrics
	stopAfter func() bool
	closeOnce sync.Once
	tier      api.Tier // the tier it was submitted at, for metrics
	release   func()   // ends the request's count on the model; idempotent
	resumed   int      // tokens of api.Params.Resume: usage counts them as generated

	// Owned by the reader.
	lastToken time.Time
	ended     bool
}

func newLocalSource(ctx context.Context, m *model, e *batcher.Entry, mt *metrics) *localSource {
	src := &localSource{model: m, entry: e, metrics: mt, tier: e.Tier}
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
func (s *localSource) Close(err error) {
	s.closeOnce.Do(func() {
		s.stopAfter()
		s.entry.Value.Watch.Stop()
		expire(s.model, s.entry, err)
	})
}

// expire ends a sequence's stream with err at once: a queued one is
// removed, a running one (maybe inside a long step) is freed by the batcher
// at the step's end. A deadline's Watch calls it directly.
func expire(m *model, e *batcher.Entry, err error) {
	seq := e.Value
	seq.Cancel(err)
	m.queue.Remove(e)
	// Answer the caller now, also while the sequence is inside a step (a
	// long prefill): the batcher frees it at the step's end.
	seq.Fail(err)
}

// Raise moves a sequence still waiting in the queue to a more urgent tier
// (request merging calls it when a more urgent request joins). A running
// sequence keeps its tier.
func (s *localSource) Raise(t api.Tier) {
	if !t.Outranks(s.entry.Value.Tier) || !s.model.queue.Remove(s.entry) {
		return
	}
	// Out of the queue and not admitted: nothing else reads the entry.
	s.entry.Tier, s.entry.Value.Tier = t, t
	s.model.queue.Requeue(s.entry)
}

// Recv returns the sequence's next chunk; see api.Source.
func (s *localSource) Recv(ctx context.Context) (api.Chunk, error) {
	c, err := s.entry.Value.Recv(ctx)
	switch {
	case err == nil:
		c = s.observe(c)
		if tok := s.model.tok; tok != nil {
			for i := range c.Top {
				c.Top[i].Text = string(tok.TokenBytes(c.Top[i].Token))
			}
		}
		return c, nil
	case errors.Is(err, batcher.ErrStreamDone):
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

// observe records token timing and, on the final chunk, the request,
// whose usage it returns counting api.Params.Resume's tokens as generated.
func (s *localSource) observe(c api.Chunk) api.Chunk {
	if c.HasToken {
		now := time.Now()
		if !s.lastToken.IsZero() {
			s.metrics.interToken(s.model.info.ID, now.Sub(s.lastToken))
		}
		s.lastToken = now
	}
	if c.Finish != "" {
		if c.Usage != nil && s.resumed > 0 {
			u := *c.Usage
			u.PromptTokens -= s.resumed
			u.CompletionTokens += s.resumed
			c.Usage = &u
		}
		s.end(c.Usage, nil)
	}
	return c
}

// end records the request's outcome once.
func (s *localSource) end(u *api.Usage, err error) {
	if s.ended {
		return
	}
	s.ended = true
	if s.release != nil {
		s.release()
	}
	s.metrics.finished(s.model.info.ID, s.tier, u, err)
}

// finishedSource is the stream of a resume with nothing left to generate
// (the broken stream had delivered all of max_tokens, but not its final
// chunk): the final chunk, then the end.
type finishedSource struct {
	mu      sync.Mutex
	final   *api.Chunk
	release func()
}

func newFinishedSource(s *Server, m *model, prompt, delivered int) *finishedSource {
	return &finishedSource{
		final:   &api.Chunk{Finish: api.FinishLength, Usage: &api.Usage{PromptTokens: prompt, CompletionTokens: delivered}},
		release: sync.OnceFunc(func() { s.release(m) }),
	}
}

func (f *finishedSource) Recv(ctx context.Context) (api.Chunk, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.final == nil {
		f.release()
		return api.Chunk{}, io.EOF
	}
	c := *f.final
	f.final = nil
	return c, nil
}

func (f *finishedSource) Close(error) { f.release() }

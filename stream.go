package mlxserving

import (
	"context"
	"errors"
	"io"
	"iter"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/batcher"
)

// Chunk is one piece of a stream: a generated token with the text it
// completed, or the final chunk with the finish reason and usage.
type Chunk = batcher.Chunk

// Usage counts a finished request's tokens and times.
type Usage = batcher.Usage

// FinishReason says why generation stopped.
type FinishReason = batcher.FinishReason

// Finish reasons.
const (
	FinishStop   = batcher.FinishStop
	FinishLength = batcher.FinishLength
)

// Stream is the output of one request, read token by token with Recv or as
// an iterator with Chunks. A Stream must be read to its end or closed;
// closing it (or cancelling the request's context) stops generation and
// frees the sequence's KV within one engine step. Recv and Close may be
// called from different goroutines.
type Stream struct {
	h         *streamHandle
	metrics   *metrics
	lastToken time.Time
	ended     bool
}

// streamHandle is what the cancellation paths hold, so an abandoned Stream
// can still be collected and its cleanup cancel the sequence.
type streamHandle struct {
	ctx       context.Context
	model     *model
	entry     *batcher.Entry
	stopAfter func() bool
	closeOnce sync.Once
}

func newStream(ctx context.Context, m *model, e *batcher.Entry, mt *metrics) *Stream {
	h := &streamHandle{ctx: ctx, model: m, entry: e}
	h.stopAfter = context.AfterFunc(ctx, func() { h.cancel(context.Cause(ctx)) })
	st := &Stream{h: h, metrics: mt}
	// A Stream dropped without Close must not hold a batch slot forever.
	runtime.AddCleanup(st, func(h *streamHandle) { h.cancel(errAbandoned) }, h)
	return st
}

var errAbandoned = errors.New("stream abandoned without Close")

// cancel stops the sequence: a queued one is removed and failed at once, a
// running one is freed by the batcher before its next step.
func (h *streamHandle) cancel(err error) {
	h.closeOnce.Do(func() {
		h.stopAfter()
		h.entry.Value.Watch.Stop()
		expire(h.model, h.entry, err)
	})
}

// expire ends a sequence with err: a queued one is removed and failed at
// once, a running one is freed by the batcher before its next step. A
// deadline's Watch calls it directly.
func expire(m *model, e *batcher.Entry, err error) {
	seq := e.Value
	seq.Cancel(err)
	if m.queue.Remove(e) {
		seq.Fail(err)
	}
}

// Recv returns the next chunk. After the final chunk (Finish set) it
// returns io.EOF. A failed request returns its error; a cancelled context
// returns ctx.Err().
func (st *Stream) Recv() (Chunk, error) {
	c, err := st.h.entry.Value.Recv(st.h.ctx)
	switch {
	case err == nil:
		st.observe(c)
		return c, nil
	case errors.Is(err, batcher.ErrStreamDone):
		st.h.stopAfter()
		st.h.entry.Value.Watch.Stop()
		return Chunk{}, io.EOF
	case st.h.ctx.Err() != nil:
		st.h.cancel(context.Cause(st.h.ctx))
		st.end(nil, st.h.ctx.Err())
		return Chunk{}, st.h.ctx.Err()
	default:
		st.h.stopAfter()
		st.h.entry.Value.Watch.Stop()
		st.end(nil, err)
		return Chunk{}, err
	}
}

// observe records token timing and, on the final chunk, the request.
func (st *Stream) observe(c Chunk) {
	if c.HasToken {
		now := time.Now()
		if !st.lastToken.IsZero() {
			st.metrics.interToken(st.h.model.info.ID, now.Sub(st.lastToken))
		}
		st.lastToken = now
	}
	if c.Finish != "" {
		st.end(c.Usage, nil)
	}
}

// end records the request's outcome once.
func (st *Stream) end(u *Usage, err error) {
	if st.ended {
		return
	}
	st.ended = true
	st.metrics.finished(st.h.model.info.ID, st.h.entry.Tier, u, err)
}

// Close stops the generation if it is still running. It is safe to call
// more than once and after the stream ended.
func (st *Stream) Close() {
	st.h.cancel(context.Canceled)
}

// Chunks returns an iterator over the stream's chunks. Breaking out of the
// loop closes the stream. The iterator yields a non-nil error at most once,
// as its last value.
func (st *Stream) Chunks() iter.Seq2[Chunk, error] {
	return func(yield func(Chunk, error) bool) {
		defer st.Close()
		for {
			c, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return
			}
			if !yield(c, err) || err != nil {
				return
			}
		}
	}
}

// Result is a whole completion, as collected by Collect.
type Result struct {
	Text     string
	Tokens   []int32
	Logprobs []float32
	Finish   FinishReason
	Usage    Usage
}

// Collect reads the stream to its end and returns the whole completion.
func (st *Stream) Collect() (Result, error) {
	var r Result
	var text strings.Builder
	for c, err := range st.Chunks() {
		if err != nil {
			return r, err
		}
		text.WriteString(c.Text)
		if c.HasToken {
			r.Tokens = append(r.Tokens, c.Token)
			r.Logprobs = append(r.Logprobs, c.Logprob)
		}
		if c.Finish != "" {
			r.Finish = c.Finish
			if c.Usage != nil {
				r.Usage = *c.Usage
			}
		}
	}
	r.Text = text.String()
	return r, nil
}

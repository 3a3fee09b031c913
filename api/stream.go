package api

import (
	"context"
	"errors"
	"io"
	"iter"
	"runtime"
	"strings"
	"sync"
)

// Source produces the chunks of one request. Whatever generates tokens
// (a Server's batcher, request merging, a load balancer, a remote backend)
// implements it and hands it to the caller wrapped in a [Stream].
type Source interface {
	// Recv returns the next chunk, blocking until there is one or ctx
	// ends. After the final chunk (Finish set) it returns io.EOF; a failed
	// request returns its error; when ctx ends it returns ctx.Err() and
	// the source stops producing.
	Recv(ctx context.Context) (Chunk, error)
	// Close stops producing and releases what the request holds (its KV,
	// its batch slot, a connection), reporting err to whatever still
	// waits. It is idempotent and safe to call concurrently with Recv.
	Close(err error)
}

// Header is what is known about a stream when it starts, before its
// first chunk. The HTTP layer reports it in response headers.
type Header struct {
	// Model is the id of the model serving the request.
	Model string
	// Session is the session the request ran under, "" for none. When the
	// request asked for a new session it holds the minted id.
	Session string
	// Cache says how request merging served the request: "" when it was
	// not eligible (not deterministic, or merging is off), "miss" for a
	// fresh generation, "hit" for a cached response, "merged" for a
	// subscription to an identical generation already running.
	Cache string
	// Backend names the backend a load balancer routed the request to.
	Backend string
	// ToolFormat names the model family's tool-call syntax (toolcall's
	// Format: "hermes", "llama3", "mistral") for chat requests; "" when
	// the model has no tokenizer.
	ToolFormat string
	// ToolForced is set when the request forced a tool call: the text is
	// the call's JSON, after the family's opening syntax.
	ToolForced bool
	// Reasoning is set for a chat reply that may begin with reasoning in a
	// <think>…</think> block (toolcall.ReasoningParser splits it off): the
	// model's chat template writes such blocks and the reply is not
	// constrained (no forced tool call, no JSON schema).
	Reasoning bool
	// ReasoningOpen is set with Reasoning when the prompt itself opened
	// the block (DeepSeek-R1's template does), so the reply begins inside
	// it.
	ReasoningOpen bool
}

// ErrAbandoned ends the generation behind a Stream that was dropped
// without being read to its end or closed.
var ErrAbandoned = errors.New("stream abandoned without Close")

// Stream is the output of one request, read token by token with Recv or as
// an iterator with Chunks. A Stream must be read to its end or closed;
// closing it (or cancelling the request's context) stops generation and
// frees what the request holds. A Stream dropped without either is closed
// when it is garbage collected. Recv and Close may be called from
// different goroutines.
type Stream struct {
	ctx    context.Context
	src    Source
	header Header
	once   sync.Once
}

// NewStream returns a Stream that reads src under ctx, the request's
// context.
func NewStream(ctx context.Context, src Source, h Header) *Stream {
	st := &Stream{ctx: ctx, src: src, header: h}
	// A Stream dropped without Close must not hold a batch slot forever.
	runtime.AddCleanup(st, func(src Source) { src.Close(ErrAbandoned) }, src)
	return st
}

// Header returns what was known about the stream when it started.
func (st *Stream) Header() Header { return st.header }

// Recv returns the next chunk. After the final chunk (Finish set) it
// returns io.EOF. A failed request returns its error; a cancelled context
// returns ctx.Err().
func (st *Stream) Recv() (Chunk, error) {
	return st.src.Recv(st.ctx)
}

// Close stops the generation if it is still running. It is safe to call
// more than once and after the stream ended.
func (st *Stream) Close() {
	st.once.Do(func() { st.src.Close(context.Canceled) })
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

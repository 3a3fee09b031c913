package batcher

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// Detokenizer turns one sequence's generated tokens into text and detects
// stop strings. The text layer's stream decoder implements it.
type Detokenizer interface {
	// Add takes the next generated token and returns the text that became
	// final. stopped reports that a stop string completed; delta then
	// holds only the text before it.
	Add(token int32) (delta string, stopped bool)
	// Flush returns the text still held back when generation ends for a
	// reason other than a stop string.
	Flush() string
}

// Sequence is one generation request as the batcher runs it. The caller
// fills the exported fields, queues it, and reads its output with Recv.
// Fields must not change once queued.
type Sequence struct {
	// Prompt is the prompt's token ids. Must not be empty.
	Prompt []int32
	// MaxTokens is the most tokens to generate. Must be at least 1.
	MaxTokens int
	// Params are the sampling parameters.
	Params engine.SamplingParams
	// StopTokens end generation like the model's EOS ids do. The token
	// that ends generation is counted in Usage but not emitted.
	StopTokens []int32
	// IgnoreEOS keeps generating past the model's EOS ids.
	IgnoreEOS bool
	// PrefixKey asks the engine to reuse KV saved under this key.
	PrefixKey string
	// SaveKey asks the engine to keep this sequence's KV under this key
	// when it finishes, for a later request's PrefixKey.
	SaveKey string
	// Text detokenizes output and finds stop strings; nil emits tokens
	// without text.
	Text Detokenizer
	// Tier is the sequence's priority, used to choose preemption victims.
	Tier api.Tier
	// Submitted is when the request arrived; zero means when queued.
	Submitted time.Time
	// Watch, when set, is told of every token the sequence produces, so
	// the request's deadlines (first token, stall, total) can fire. The
	// batcher does not stop it.
	Watch *retry.Watch
	// Constraint, when set, restricts every sampled token (constrained
	// decoding); the sequence finishes with FinishStop when it is Done,
	// and with FinishLength when it allows no token at all.
	Constraint Constraint

	cancelled atomic.Bool
	out       outbox

	// Owned by the batcher's loop.
	id          engine.SeqID
	generated   []int32
	feed        []int32 // tokens to prefill after Open: prompt (+ generated on recompute)
	fed         int     // tokens of feed already stepped
	kv          int     // tokens the engine holds for the sequence: reused + every token fed
	open        bool
	admitted    time.Time
	firstToken  time.Time
	cached      int
	preemptions int
	retries     *retry.Tracker // started at the first failed attempt
	mask        []uint64       // the Constraint's mask for the next sample
	maskReady   bool           // mask was filled for this step
}

// Constraint restricts which tokens a sequence may sample, one step at a
// time; engine/grammar's Matcher implements it. The batcher's loop calls
// it and nothing else does.
type Constraint interface {
	// FillMask sets the bits of the tokens allowed next (see
	// engine.StepInput.Allowed) and clears the others.
	FillMask(mask []uint64)
	// Accept advances past a sampled token.
	Accept(tok int32) error
	// Done reports that nothing but the end may follow.
	Done() bool
}

// Cancel asks the batcher to stop the sequence. A running sequence is
// freed before the next engine step; its stream ends with err.
func (s *Sequence) Cancel(err error) {
	s.out.setCancelErr(err)
	s.cancelled.Store(true)
}

// Fail ends the sequence's stream with err unless it has already ended.
// The owner of the queue calls it for a sequence that never ran (removed
// while queued, drained at shutdown).
func (s *Sequence) Fail(err error) { s.out.finish(api.Chunk{}, err) }

// Generated returns how many tokens the sequence has produced so far. Safe
// only after the stream ended.
func (s *Sequence) Generated() int { return len(s.generated) }

// Recv returns the next chunk, blocking until one is ready or ctx ends.
// After the final chunk (Finish set) it returns ErrStreamDone; if the
// sequence failed it returns that error.
func (s *Sequence) Recv(ctx context.Context) (api.Chunk, error) {
	return s.out.next(ctx)
}

// Done is closed when the final chunk or an error has been queued for the
// reader.
func (s *Sequence) Done() <-chan struct{} { return s.out.doneCh() }

// outbox buffers a sequence's chunks between the batcher, which never
// blocks on a slow reader, and the reader. It is bounded by MaxTokens + 1.
type outbox struct {
	mu        sync.Mutex
	chunks    []api.Chunk
	head      int
	err       error
	cancelErr error
	ended     bool // final chunk or error queued
	once      sync.Once
	ready     chan struct{}
	done      chan struct{}
}

// init makes the channels; every method that touches them calls it, so a
// Sequence's zero value is ready to use.
func (o *outbox) init() {
	o.once.Do(func() {
		o.ready = make(chan struct{}, 1)
		o.done = make(chan struct{})
	})
}

func (o *outbox) doneCh() <-chan struct{} {
	o.init()
	return o.done
}

func (o *outbox) setCancelErr(err error) {
	o.mu.Lock()
	if o.cancelErr == nil {
		o.cancelErr = err
	}
	o.mu.Unlock()
}

func (o *outbox) cancelError() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cancelErr == nil {
		return context.Canceled
	}
	return o.cancelErr
}

// push queues a chunk; a no-op after the stream ended.
func (o *outbox) push(c api.Chunk) {
	o.mu.Lock()
	if !o.ended {
		o.chunks = append(o.chunks, c)
	}
	o.mu.Unlock()
	o.signal()
}

// finish queues the final chunk (err == nil) or the error, once.
func (o *outbox) finish(last api.Chunk, err error) bool {
	o.mu.Lock()
	if o.ended {
		o.mu.Unlock()
		return false
	}
	o.ended = true
	o.init()
	if err != nil {
		o.err = err
	} else {
		o.chunks = append(o.chunks, last)
	}
	o.mu.Unlock()
	close(o.done)
	o.signal()
	return true
}

func (o *outbox) signal() {
	o.init()
	select {
	case o.ready <- struct{}{}:
	default:
	}
}

func (o *outbox) next(ctx context.Context) (api.Chunk, error) {
	o.init()
	for {
		o.mu.Lock()
		if o.head < len(o.chunks) {
			c := o.chunks[o.head]
			o.chunks[o.head] = api.Chunk{}
			o.head++
			if o.head == len(o.chunks) {
				o.chunks, o.head = o.chunks[:0], 0
			}
			o.mu.Unlock()
			return c, nil
		}
		ended, err := o.ended, o.err
		o.mu.Unlock()
		if ended {
			if err != nil {
				return api.Chunk{}, err
			}
			return api.Chunk{}, ErrStreamDone
		}
		select {
		case <-o.ready:
		case <-ctx.Done():
			return api.Chunk{}, ctx.Err()
		}
	}
}

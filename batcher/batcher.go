package batcher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/scheduler"
)

var (
	// ErrStreamDone is returned by Recv after the final chunk.
	ErrStreamDone = errors.New("stream done")
	// ErrClosed ends the streams of sequences still running when the
	// batcher is closed.
	ErrClosed = fmt.Errorf("batcher: %w", engine.ErrClosed)
)

// Entry is a queued sequence with its scheduling metadata.
type Entry = scheduler.Entry[*Sequence]

// Queue is where the batcher takes waiting sequences from. The priority
// scheduler implements it.
type Queue interface {
	// Pop removes and returns the most urgent entry if admit accepts it.
	// When admit refuses the most urgent entry, Pop returns it as blocked
	// and leaves it queued.
	Pop(admit func(*Sequence) bool) (next, blocked *Entry)
	// Requeue puts back an entry the batcher preempted or must recompute.
	Requeue(*Entry)
	// Ready receives a value whenever work is added.
	Ready() <-chan struct{}
	// Preempts reports whether a waiting entry of one tier may evict a
	// running entry of another.
	Preempts(waiting, running api.Tier) bool
}

// ContinuousBatcher runs one model's sequences with iteration-level
// batching: sequences join and leave the running batch at every step,
// prompts are prefilled in chunks mixed with decode under a per-step token
// budget, and admission respects the batch limit, the token budget and the
// engine's KV capacity.
//
// One goroutine, started by New and stopped by Close or Shutdown, owns the
// running batch and is the only caller of the model's Open, Step and Free.
type ContinuousBatcher struct {
	model engine.Model
	info  engine.Info
	queue Queue
	cfg   config

	cancel   context.CancelFunc
	draining chan struct{}
	drainOne sync.Once
	done     chan struct{}

	// Owned by the loop goroutine.
	running  []*Entry
	reserved int // KV tokens reserved by running sequences
	nextID   engine.SeqID
	limit    int // current adaptive batch limit
	inputs   []engine.StepInput
	stepSeqs []*Sequence // stepSeqs[i] is the sequence of inputs[i]
	// embedded is set when the last step carried embedding inputs: while
	// sequences decode, embeddings join every other step only.
	embedded bool
	maskSeqs []*Sequence // constrained sequences whose masks a step fills
	admitFn  func(*Sequence) bool
	emaStep  time.Duration
	stepEnd  time.Time // when the last step returned; zero after a wait for work (StepStats.Between)
	// Text work of the last step's tokens that runs behind the next step
	// (WithTextBehindStep): at most one chunk a sequence; pendingSpare is
	// the other buffer of the pair the step swaps.
	pending, pendingSpare []pendingChunk

	// Pipelined steps (pipeline.go): the model's Pipeliner, nil when the
	// loop steps synchronously; the step sent and not delivered; the
	// buffers of the last delivered one; the id of the last step sent;
	// whether the next step must be synchronous (after a failure), or the
	// pending one delivered first (plan met a preemption); the opens
	// sent and not answered.
	piper     engine.Pipeliner
	pend      *sentStep
	spare     *sentStep
	lastSent  uint64
	syncNext  bool
	wantDrain bool
	opening   int
	orphans   []engine.PendingOpen // opens of sequences freed before their answer

	// Paged KV (blocks.go): the model's pool, nil when it does not page;
	// the blocks an admission round has left (valid while leftValid);
	// the free blocks the engine reported last; whether the engine
	// refused a step for want of blocks since a step last ran whole
	// (admission waits for one).
	pool      engine.BlockPool
	left      int
	leftValid bool
	lastFree  int
	refused   bool

	statsMu sync.Mutex
	stats   Stats

	delayMu sync.Mutex
	delayed map[*Entry]*time.Timer // failed sequences waiting to be retried
}

// New starts a batcher for model, taking work from queue. Options are
// validated before the loop starts.
func New(model engine.Model, queue Queue, opts ...Option) (*ContinuousBatcher, error) {
	if model == nil || queue == nil {
		return nil, errors.New("batcher: model and queue are required")
	}
	info := model.Info()
	if info.MaxBatch < 1 || info.KVCapacity < 1 || info.ContextLength < 1 {
		return nil, fmt.Errorf("batcher: model %q reports unusable limits (max batch %d, KV capacity %d, context %d)",
			info.ID, info.MaxBatch, info.KVCapacity, info.ContextLength)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("batcher: %w", err)
		}
	}
	if err := cfg.resolve(info); err != nil {
		return nil, fmt.Errorf("batcher: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &ContinuousBatcher{
		model:    model,
		info:     info,
		queue:    queue,
		cfg:      cfg,
		cancel:   cancel,
		draining: make(chan struct{}),
		done:     make(chan struct{}),
		limit:    cfg.maxBatch,
		inputs:   make([]engine.StepInput, 0, cfg.maxBatch),
		stepSeqs: make([]*Sequence, 0, cfg.maxBatch),
	}
	if cfg.targetStep > 0 {
		b.limit = cfg.minBatch
	}
	b.admitFn = b.fits
	if !cfg.noPipeline {
		b.piper, _ = model.(engine.Pipeliner)
	}
	if b.pool = pagedPool(model, info); b.pool != nil {
		b.admitFn = b.fitsBlocks
		b.lastFree = info.KVBlocks
	}
	b.stats.Limit = b.limit
	go b.loop(ctx)
	return b, nil
}

// Info returns the model's description.
func (b *ContinuousBatcher) Info() engine.Info { return b.info }

// Close stops the batcher at once: sequences still running end with
// ErrClosed and their KV is freed. It returns when the loop has exited.
// Entries still queued stay in the queue; the queue's owner fails them.
func (b *ContinuousBatcher) Close() {
	b.cancel()
	<-b.done
}

// Shutdown waits until the queue has nothing left this batcher can admit
// and every running sequence has finished, then stops the loop. The caller
// stops adding work first. If ctx ends first it closes the batcher, ending
// the running sequences with ErrClosed, and returns ctx.Err().
func (b *ContinuousBatcher) Shutdown(ctx context.Context) error {
	b.drainOne.Do(func() { close(b.draining) })
	select {
	case <-b.done:
		return nil
	case <-ctx.Done():
		b.Close()
		return ctx.Err()
	}
}

func (b *ContinuousBatcher) loop(ctx context.Context) {
	defer close(b.done)
	defer b.failDelayed(ErrClosed)
	defer b.abandon(ctx)
	defer b.failRunning(ErrClosed)
	for {
		b.reapCancelled()
		b.admit(ctx)
		b.publishOccupancy()
		if len(b.running) == 0 && b.pend != nil {
			b.drain(ctx) // what is left of the sequences it ran
			continue
		}
		if len(b.running) == 0 {
			b.flushText()
			b.stepEnd = time.Time{} // the next step's Between counts from its own work, not this wait
			drain := b.draining
			if isClosed(b.draining) {
				if b.waitingRetries() == 0 {
					return // nothing running and nothing admissible left
				}
				drain = nil // wait for the retries to come back
			}
			select {
			case <-b.queue.Ready():
			case <-drain:
			case <-ctx.Done():
				return
			}
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if b.piper != nil {
			b.stepAhead(ctx)
		} else {
			b.step(ctx)
		}
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// need is the KV a sequence reserves: its whole possible length, so a
// running sequence never runs out of KV mid-generation. Nothing on a
// paged model, whose sequences take blocks as they grow (blocks.go).
func (b *ContinuousBatcher) need(s *Sequence) int {
	if b.pool != nil {
		return 0
	}
	return min(len(s.Prompt)+s.MaxTokens, b.info.ContextLength)
}

// fits is the admission test handed to the queue. An empty batch admits
// anything, so a request too large for the KV fails on Open instead of
// blocking the queue forever.
func (b *ContinuousBatcher) fits(s *Sequence) bool {
	if len(b.running) == 0 {
		return true
	}
	return len(b.running) < b.limit && b.reserved+b.need(s) <= b.info.KVCapacity
}

// admit moves sequences from the queue into the running batch while they
// fit, preempting lower tiers for a blocked critical one when allowed.
func (b *ContinuousBatcher) admit(ctx context.Context) {
	b.leftValid = false
	if len(b.running) == 0 {
		b.refused = false
	}
	if b.refused {
		return // the refused sequences step first (blocks.go, preemptRefused)
	}
	for {
		next, blocked := b.queue.Pop(b.admitFn)
		if next == nil {
			if blocked == nil || !b.preemptFor(ctx, blocked) {
				return
			}
			continue
		}
		if !b.start(ctx, next) {
			return
		}
	}
}

// start opens a sequence in the engine and adds it to the running batch.
// It reports whether admission may go on this round.
func (b *ContinuousBatcher) start(ctx context.Context, e *Entry) bool {
	s := e.Value
	if s.cancelled.Load() {
		s.out.finish(api.Chunk{}, s.out.cancelError())
		return true
	}
	if s.Submitted.IsZero() {
		s.Submitted = e.Enqueued
	}
	b.nextID++
	s.id = b.nextID
	s.fed, s.kv, s.ahead, s.sampleIn, s.opening, s.reused = 0, 0, 0, 0, nil, 0
	s.feed = s.Prompt
	s.params = s.Params
	s.forced = 0              // a recompute feeds every generated token
	if len(s.generated) > 0 { // recompute after preemption or a lost worker
		s.feed = append(append(make([]int32, 0, len(s.Prompt)+len(s.generated)), s.Prompt...), s.generated...)
		// The engine continues the draws and the penalty counts where they
		// stopped (engine.SamplingParams.Generated).
		s.params.Generated += len(s.generated)
	}
	reused, err := b.open(ctx, s)
	if err != nil {
		b.model.Free(s.id, "")
		return b.openFailed(e, err, len(b.running))
	}
	s.open = true
	b.admittedBlocks(s)
	if s.opening == nil {
		b.opened(s, reused)
	} else if s.admitted.IsZero() {
		// Its queue wait ends now; what it reused is known at the answer.
		s.admitted, s.cachedAtAnswer = time.Now(), true
	}
	b.reserved += b.need(s)
	b.running = append(b.running, e)
	if len(s.Forced) > 0 {
		b.startForced(s)
	}
	return true
}

// openFailed handles an Open that failed (the sequence freed in the
// engine), others being the sequences running beside it. It reports
// whether admission may go on this round.
func (b *ContinuousBatcher) openFailed(e *Entry, err error, others int) bool {
	switch {
	case errors.Is(err, engine.ErrOutOfMemory) && others > 0:
		b.queue.Requeue(e) // fits once running sequences finish
		return false
	case b.cfg.retry.Retryable(err):
		return !b.retryOrFail(e, err)
	default:
		e.Value.out.finish(api.Chunk{}, err)
		return true
	}
}

// opened records what the engine's Open of s reused. A first chunk sent
// behind an asynchronous open (engine.StepInput.Opening, counted in
// s.ahead) feeds what it holds past the reused prefix: the reused tokens
// it does not cover count as fed now.
func (b *ContinuousBatcher) opened(s *Sequence, reused int) {
	s.fed = max(reused-s.ahead, 0)
	s.kv, s.reused = s.fed, reused
	if s.admitted.IsZero() || s.cachedAtAnswer {
		if s.admitted.IsZero() {
			s.admitted = time.Now()
		}
		s.cached, s.cachedAtAnswer = reused, false
	}
}

// open opens s in the engine: OpenPooled for an embedding sequence, Open
// for a generating one — sent without waiting for the answer when the
// loop pipelines (s.opening; the sequence steps once it is answered).
// An Open that waits for its answer delivers the pending step first.
func (b *ContinuousBatcher) open(ctx context.Context, s *Sequence) (reused int, err error) {
	if s.Pool == engine.PoolNone && !b.info.Encoder && b.openAsync(ctx, s) {
		return 0, nil
	}
	b.drain(ctx)
	if s.Pool == engine.PoolNone {
		if b.info.Encoder {
			return 0, &engine.InvalidParamError{Param: "model", Reason: fmt.Sprintf("model %q is an embedding encoder: it does not generate", b.info.ID)}
		}
		if s.Adapter == "" {
			return b.model.Open(ctx, s.id, s.feed, s.PrefixKey)
		}
		am, ok := b.model.(engine.AdapterModel)
		if !ok || b.info.AdapterSlots == 0 {
			return 0, &engine.InvalidParamError{Param: "model", Reason: fmt.Sprintf("model %q serves no LoRA adapters", b.info.ID)}
		}
		return am.OpenAdapter(ctx, s.id, s.feed, s.PrefixKey, s.Adapter)
	}
	e, ok := b.model.(engine.Embedder)
	if !ok || b.info.EmbedDim == 0 {
		return 0, &engine.InvalidParamError{Param: "model", Reason: fmt.Sprintf("model %q does not embed", b.info.ID)}
	}
	return 0, e.OpenPooled(ctx, s.id, s.feed, s.Pool)
}

// startForced delivers a resumed sequence's Forced tokens before its
// first sample, as the jump-forward run they belong to would have, and
// feeds them after the prompt.
func (b *ContinuousBatcher) startForced(s *Sequence) {
	forced := s.Forced
	s.Forced = nil
	if !b.cfg.jumpForward || len(s.generated) > 0 {
		return
	}
	now := time.Now()
	s.firstToken, s.lastToken = now, now
	for _, tok := range forced {
		s.forcedTotal++
		if b.emit(s, api.Chunk{Token: tok, HasToken: true}, now) {
			b.removeFinished()
			return
		}
	}
	s.feed = append(slices.Clip(s.feed), s.generated...)
	s.params.Generated += len(s.generated)
}

// preemptFor evicts the lowest-tier, most recently admitted running
// sequence if the blocked entry's tier may preempt it. The victim is
// requeued and later recomputes its prompt and the tokens it generated.
// With a step pending it delivers that step first and reports true, so
// admission looks again at what the delivery freed.
func (b *ContinuousBatcher) preemptFor(ctx context.Context, blocked *Entry) bool {
	victim := b.victim(func(e *Entry) bool { return b.queue.Preempts(blocked.Tier, e.Tier) })
	if victim < 0 {
		return false
	}
	if b.pend != nil {
		b.drain(ctx)
		b.leftValid = false
		return true
	}
	b.preempt(victim)
	b.leftValid = false // the victim's blocks came back
	return true
}

// victim returns the index of the lowest-tier, most recently admitted
// running sequence that may be preempted, or -1.
func (b *ContinuousBatcher) victim(may func(*Entry) bool) int {
	victim := -1
	for i, e := range b.running {
		if !may(e) {
			continue
		}
		if victim < 0 || b.running[victim].Tier.Outranks(e.Tier) ||
			(b.running[victim].Tier == e.Tier && e.Value.admitted.After(b.running[victim].Value.admitted)) {
			victim = i
		}
	}
	return victim
}

// preempt frees running sequence i and requeues it; it recomputes its
// prompt and generated tokens when admitted again.
func (b *ContinuousBatcher) preempt(i int) {
	b.flushText()
	e := b.running[i]
	b.release(e, "")
	b.removeRunning(i)
	e.Value.preemptions++
	b.queue.Requeue(e)
}

// release frees a running sequence's KV and reservation.
func (b *ContinuousBatcher) release(e *Entry, saveKey string) { b.free(e.Value, saveKey) }

// free frees s's KV in the engine (keeping it under saveKey when set) and
// its reservation.
func (b *ContinuousBatcher) free(s *Sequence, saveKey string) {
	b.model.Free(s.id, saveKey)
	if s.opening != nil { // freed before its open was answered: read the answer later
		b.orphans = append(b.orphans, s.opening)
		s.opening = nil
		b.opening--
	}
	s.open = false
	b.reserved -= b.need(s)
}

func (b *ContinuousBatcher) removeRunning(i int) {
	last := len(b.running) - 1
	copy(b.running[i:], b.running[i+1:])
	b.running[last] = nil
	b.running = b.running[:last]
}

// reapCancelled frees cancelled sequences before the next step, so a
// cancellation releases KV within one engine step.
func (b *ContinuousBatcher) reapCancelled() {
	kept := b.running[:0]
	for _, e := range b.running {
		s := e.Value
		if s.cancelled.Load() {
			b.flushText() // its pending chunk first, as its reader expects
			b.release(e, "")
			s.out.finish(api.Chunk{}, s.out.cancelError())
			continue
		}
		kept = append(kept, e)
	}
	clear(b.running[len(kept):])
	b.running = kept
}

// failRunning ends every running sequence with err and frees it.
func (b *ContinuousBatcher) failRunning(err error) {
	b.flushText()
	for _, e := range b.running {
		b.release(e, "")
		e.Value.out.finish(api.Chunk{}, err)
	}
	clear(b.running)
	b.running = b.running[:0]
	b.publishOccupancy()
}

package enginetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/lru"
	"github.com/mlxserving/mlxserving/internal/mix"
)

// Sim is a simulated engine: no model, deterministic pseudo-tokens, a
// configurable step-time model and KV capacity. It implements
// [engine.Engine]; its models follow the engine contract exactly, so the
// serving layer can be tested and benchmarked against it.
//
// The next token of a sequence is a pure function of the sequence's full
// token history (and of the seed when sampling with a temperature above
// zero; an unseeded sampling sequence gets a seed of its own at Open). KV
// accounting is real: Open reserves the prompt's tokens, Steps grow a
// sequence past that, Free releases it; exceeding the capacity returns
// [engine.ErrOutOfMemory]. Prefixes saved by Free with a key live in a
// bounded LRU that does not count against the capacity; Open reuses the
// longest common prefix of a saved entry and the prompt, and the models
// implement [engine.SavedKV], reporting the saves the LRU bound evicts.
//
// Allowed-token masks, logit bias and presence/frequency penalties are
// honoured: a mask alone keeps the natural token when allowed and
// otherwise picks an allowed one by the hash; bias and penalties score
// every token with a pseudo logit (the natural token highest) and take the
// best, so +100 forces a token and -100 bans one. TopLogprobs lists the
// sampled token and others with falling pseudo log-probabilities.
//
// Bad input is refused before any sequence changes: an unknown or repeated
// sequence, empty tokens, ids outside the vocabulary, sampling parameters
// out of range or a batch over MaxBatch with an *[engine.InvalidParamError],
// a sequence grown past the context with an *[engine.ContextLengthError].
// Step's own CPU cost is a few hundred nanoseconds per input and one
// allocation, the output slice (BenchmarkSimStep measures it).
//
// The Path of a ModelSpec is not read: "" or any directory loads. Each
// Load gives an independent model; Stats add up all of them.
//
// Its models report [engine.Info.Resumes] and follow Generated of
// [engine.SamplingParams]: a sampled draw mixes in the seed and the
// generated position (samples and forced tokens since Open plus
// Generated), and a sequence's first sample counts the prompt's last
// Generated tokens for presence and frequency penalties ([WithoutResume]
// turns that off). They report [engine.Info.JumpForward]: tokens fed with
// a sample after the sequence's first count as generated, each advancing
// the generated position ([WithoutJumpForward] turns that off).
// [WithWorkerLoss] fails random Steps as a crashed worker does.
//
// Its models implement [engine.Warmer]: with [WithCompileTime] the first
// Step at each batch-size bucket pays a compile time, as a real engine's
// kernel compilation or graph capture does, and Warm pays it ahead of
// traffic. [WithMemory] makes Info report weight and KV bytes.
//
// Its models implement [engine.Pipeliner]: StepAsync checks and applies
// its batch at once — a Prev input resolves from the sequence's last
// sample, an Opening input feeds the tokens of its chunk past the prefix
// its sequence's open reused (refused in a Step, with Prev, and once the
// sequence was stepped), a later Free is ordered after the step — and its
// Wait returns when the simulated device, running the steps sent back to
// back, has finished it, so the caller's work between steps is hidden as
// on a real device. Errors a worker decides (out of memory, a lost
// worker) come from Wait, and a step sent behind a failed one is not run
// (engine.ErrNotRun). Step and Open while a step is pending fail with
// [ErrPending]. [WithoutPipeline] makes models that do not implement it,
// [WithPipelineAbove] ones that decline small batches, and [SimStats]
// counts the steps pipelined and the rows wasted.
//
// Its models serve LoRA adapters ([engine.AdapterModel]): real adapter
// files, read and checked as the engines read them; an adapter's
// sequences draw tokens of their own, and slots, eviction and KV keyed by
// adapter behave as the contract says.
type Sim struct {
	cfg simConfig

	mu     sync.Mutex
	closed bool
	models map[*simModel]struct{}

	stats simCounters
	seeds atomic.Uint64
	steps atomic.Uint64 // Steps tried, for WithWorkerLoss
}

// SimStats is a snapshot of a [Sim]'s counters, across all its models.
type SimStats struct {
	// Steps is the number of Step and StepAsync calls that ran a
	// non-empty batch.
	Steps int64
	// Pipelined is the number of StepAsync calls that sent their batch
	// (ok true, no error), whether its Wait then failed or not; Declined
	// the number that answered ok false ([WithPipelineAbove]).
	Pipelined, Declined int64
	// Wasted is the number of samples taken for sequences that were freed
	// while the step taking them was pending: rows a pipelining caller
	// planned before it knew the sequence had finished.
	Wasted int64
	// Tokens is the number of tokens fed through Step.
	Tokens int64
	// Sampled is the number of tokens Step returned.
	Sampled int64
	// MaxBatch is the largest batch one Step carried.
	MaxBatch int
	// KVTokens is the KV held by open sequences now, in tokens.
	KVTokens int
	// OpenSequences is the number of sequences opened and not yet freed.
	OpenSequences int
	// Models is the number of models loaded and not closed.
	Models int
	// Loads is the number of Load calls that returned a model.
	Loads int64
	// ColdSteps is the number of Steps (Warm's included) that paid the
	// compile time of [WithCompileTime] for a bucket not seen before.
	ColdSteps int64
	// AdapterLoads counts LoRA adapters made resident by OpenAdapter or
	// WarmAdapter (first use, or use after eviction).
	AdapterLoads int64
	// AdapterWarms counts the WarmAdapter calls that succeeded.
	AdapterWarms int64
	// Polled is the time Steps spent polling the clock at the end of
	// their wait (see [WithStepTime]): CPU the simulated device burns, not
	// the caller's.
	Polled time.Duration
}

type simCounters struct {
	steps, tokens, sampled atomic.Int64
	maxBatch, kv, open     atomic.Int64
	models, loads, cold    atomic.Int64
	adapterLoads, polled   atomic.Int64
	adapterWarms           atomic.Int64
	pipelined, declined    atomic.Int64
	wasted                 atomic.Int64
}

// NewSim returns a simulated engine configured by opts; see the Default*
// constants for what it does without them.
func NewSim(opts ...SimOption) (*Sim, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Sim{cfg: cfg, models: make(map[*simModel]struct{})}, nil
}

// Name returns "sim".
func (s *Sim) Name() string { return "sim" }

// Load returns a new simulated model after the configured load time. The
// spec's MaxBatch and KVCapacity replace the engine's settings when set;
// its ContextLength lowers the context. spec.Path is not read.
func (s *Sim) Load(ctx context.Context, spec engine.ModelSpec) (engine.Model, error) {
	info, err := s.info(spec)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("enginetest: load %q: %w", spec.ID, engine.ErrClosed)
	}
	if err := s.wait(ctx, s.cfg.loadTime); err != nil {
		return nil, err
	}
	m := &simModel{
		sim:      s,
		info:     info,
		pick:     picker{vocab: uint64(info.VocabSize), eos: info.EOS, eosProb: s.cfg.eosProb},
		seqs:     make(map[engine.SeqID]*simSeq),
		adapters: make(map[string]*simAdapter),
		done:     make(chan struct{}),
	}
	m.saves = lru.New[string, []int32](int64(s.cfg.prefixEntries), 0, m.onEvict) // each save of weight 1
	m.timer = time.NewTimer(time.Hour)
	m.timer.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("enginetest: load %q: %w", spec.ID, engine.ErrClosed)
	}
	s.models[m] = struct{}{}
	s.stats.models.Add(1)
	s.stats.loads.Add(1)
	if s.cfg.noPipeline {
		return m, nil
	}
	return pipeModel{m}, nil
}

// info checks spec and applies its overrides to the engine's settings.
func (s *Sim) info(spec engine.ModelSpec) (engine.Info, error) {
	switch {
	case spec.ID == "":
		return engine.Info{}, &engine.InvalidParamError{Param: "id", Reason: "a model needs an id"}
	case spec.MaxBatch < 0:
		return engine.Info{}, badOption("max batch", spec.MaxBatch, "0 (default) or more")
	case spec.KVCapacity < 0:
		return engine.Info{}, badOption("kv capacity", spec.KVCapacity, "0 (default) or more")
	case spec.ContextLength < 0 || spec.ContextLength == 1:
		return engine.Info{}, badOption("context length", spec.ContextLength, "0 (default) or 2 and more")
	}
	info := engine.Info{
		ID: spec.ID, Engine: s.Name(), ContextLength: s.cfg.contextLength, VocabSize: s.cfg.vocabSize,
		BOS: -1, EOS: append([]int32(nil), s.cfg.eos...), KVCapacity: s.cfg.kvCapacity, MaxBatch: s.cfg.maxBatch,
	}
	if spec.MaxBatch > 0 {
		info.MaxBatch = spec.MaxBatch
	}
	if spec.KVCapacity > 0 {
		info.KVCapacity = spec.KVCapacity
	}
	if spec.ContextLength > 0 {
		info.ContextLength = min(info.ContextLength, spec.ContextLength)
	}
	if bs := s.cfg.blockSize; bs > 0 {
		info.BlockSize, info.KVBlocks = bs, info.KVCapacity/bs
		if info.KVBlocks < 1 {
			return engine.Info{}, badOption("kv capacity", spec.KVCapacity, fmt.Sprintf("at least one block of %d tokens", bs))
		}
		info.KVCapacity = info.KVBlocks * bs
		info.ContextLength = min(info.ContextLength, info.KVCapacity) // one sequence cannot outgrow the pool
	}
	info.Resumes = !s.cfg.noResume
	info.JumpForward = !s.cfg.noJumpForward
	info.EmbedDim, info.Pooling, info.Normalize = s.cfg.embedDim, s.cfg.pooling, s.cfg.normalize
	info.Encoder, info.Matryoshka = s.cfg.encoder, s.cfg.matryoshka
	info.AdapterSlots, info.MaxAdapterRank = engine.DefaultAdapterSlots, engine.DefaultMaxAdapterRank
	if spec.AdapterSlots > 0 {
		info.AdapterSlots = spec.AdapterSlots
	}
	if spec.MaxAdapterRank > 0 {
		info.MaxAdapterRank = spec.MaxAdapterRank
	}
	info.AdapterBytes = s.cfg.adapterBytes
	info.WeightBytes = s.cfg.weightBytes
	info.KVBytes = s.cfg.kvTokenBytes * int64(info.KVCapacity)
	return info, nil
}

// wait sleeps d or until ctx ends.
func (s *Sim) wait(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close closes every model the engine loaded. Later calls return
// [engine.ErrClosed]. Close is idempotent.
func (s *Sim) Close() error {
	s.mu.Lock()
	s.closed = true
	models := s.models
	s.models = make(map[*simModel]struct{})
	s.mu.Unlock()
	for m := range models {
		_ = m.Close()
	}
	return nil
}

// forget drops a closed model from the engine's set.
func (s *Sim) forget(m *simModel) {
	s.mu.Lock()
	delete(s.models, m)
	s.mu.Unlock()
}

// Stats returns a snapshot of the counters. It is safe for concurrent use,
// also while a Step runs.
func (s *Sim) Stats() SimStats {
	return SimStats{
		Steps:         s.stats.steps.Load(),
		Pipelined:     s.stats.pipelined.Load(),
		Declined:      s.stats.declined.Load(),
		Wasted:        s.stats.wasted.Load(),
		Tokens:        s.stats.tokens.Load(),
		Sampled:       s.stats.sampled.Load(),
		MaxBatch:      int(s.stats.maxBatch.Load()),
		KVTokens:      int(s.stats.kv.Load()),
		OpenSequences: int(s.stats.open.Load()),
		Models:        int(s.stats.models.Load()),
		Loads:         s.stats.loads.Load(),
		ColdSteps:     s.stats.cold.Load(),
		AdapterLoads:  s.stats.adapterLoads.Load(),
		AdapterWarms:  s.stats.adapterWarms.Load(),
		Polled:        time.Duration(s.stats.polled.Load()),
	}
}

// noteBatch records a batch size if it is the largest seen.
func (c *simCounters) noteBatch(n int64) {
	for {
		cur := c.maxBatch.Load()
		if n <= cur || c.maxBatch.CompareAndSwap(cur, n) {
			return
		}
	}
}

// loseStep reports whether the next Step loses its worker
// (WithWorkerLoss).
func (s *Sim) loseStep() bool {
	if s.cfg.lossRate == 0 {
		return false
	}
	x := mix.Mix64(s.steps.Add(1)*seedSalt ^ mix.Mix64(s.cfg.lossSeed+eosSalt))
	return float64(x>>11)/unitDenom < s.cfg.lossRate
}

// newSeed returns a fresh seed for a sequence that samples without one.
func (s *Sim) newSeed() uint64 { return mix.Mix64(s.seeds.Add(1) * seedSalt) }

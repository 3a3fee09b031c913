package session

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/lru"
)

// CacheStats counts a PrefixCache's lookups and what it holds.
type CacheStats struct {
	// Queries is the number of prompt tokens looked up at Open and Hits
	// the number the engine reused from saved KV: vLLM's
	// prefix_cache_queries and prefix_cache_hits.
	Queries, Hits int64
	// Lookups counts Opens; LookupHits those that reused at least one
	// token.
	Lookups, LookupHits int64
	// Keys and Tokens are the saved KV entries indexed now and the tokens
	// they hold.
	Keys, Tokens int
	// Evicted counts entries the engine evicted for memory or lost with a
	// worker; Dropped those the cache dropped (token budget, Drop); Stale
	// those the index named but the engine no longer held.
	Evicted, Dropped, Stale int64
}

// CacheOption configures a PrefixCache.
type CacheOption func(*cacheConfig) error

type cacheConfig struct {
	budget  int
	block   int
	onLost  func(key string)
	onSaved func(key string, worker int)
}

// WithTokenBudget bounds the tokens of saved KV the cache keeps; past it
// the least recently used entries are dropped from the engine. Zero (the
// default) uses the model's KV capacity. The engine may evict sooner for
// memory; saved KV never blocks admission.
func WithTokenBudget(tokens int) CacheOption {
	return func(c *cacheConfig) error {
		if tokens < 0 {
			return errors.New("session: token budget must not be negative")
		}
		c.budget = tokens
		return nil
	}
}

// WithBlockSize sets the tokens per indexed block. Default
// DefaultBlockSize.
func WithBlockSize(n int) CacheOption {
	return func(c *cacheConfig) error {
		if n < 1 || n > 4096 {
			return errors.New("session: block size must be 1 to 4096")
		}
		c.block = n
		return nil
	}
}

// WithOnLost calls fn with every key whose saved KV the engine evicted or
// lost with a worker (not those the cache dropped itself), so a session
// registry can forget the session. fn runs on the caller of Open and Free
// (the batcher's loop) and must not block.
func WithOnLost(fn func(key string)) CacheOption {
	return func(c *cacheConfig) error {
		if fn == nil {
			return errors.New("session: nil lost-key callback")
		}
		c.onLost = fn
		return nil
	}
}

// WithOnSaved calls fn after Free saved a sequence's KV under key, with
// the engine worker holding it when the model can tell
// (engine.WorkerLocator: a worker pool such as the Python engine's; -1
// otherwise), so a session registry can
// record the session's affinity. fn runs on the caller of Free and must
// not block.
func WithOnSaved(fn func(key string, worker int)) CacheOption {
	return func(c *cacheConfig) error {
		if fn == nil {
			return errors.New("session: nil saved-key callback")
		}
		c.onSaved = fn
		return nil
	}
}

// PrefixCache wraps a model to make prefix caching automatic. It is an
// engine.Model: Open looks the prompt up in an Index of the KV the engine
// saved and passes the engine the key of the entry sharing the longest
// prefix (or the caller's key when that shares as much), Step hashes the
// tokens each sequence is fed, Free with a key indexes what the engine
// saved. The saved KV is kept within a token budget, least recently used
// dropped first, and entries the engine evicts or loses leave the index.
//
// Like any engine.Model, Open, Step and Free are serialised by the caller;
// Drop, NewKey and Stats are safe from any goroutine.
type PrefixCache struct {
	m   engine.Model
	sk  engine.SavedKV // nil when the model reports no evictions
	cfg cacheConfig

	mu      sync.Mutex
	idx     *Index
	lru     *lru.LRU[string, struct{}] // keys weighted by tokens, bounded by the budget
	dropped []string                   // keys the budget dropped in the last Add, to drop in the engine
	pending map[string]struct{}        // keys dropped outside the loop, to drop in the engine: once each
	stats   CacheStats

	keys atomic.Uint64
	seqs map[engine.SeqID]*Hasher // owned by the caller of Open, Step and Free
	// Pipelined steps (pipeline.go), owned by the same caller: the last
	// token each sequence sampled in a step run ahead, what a Prev input
	// feeds; the sequences whose open was sent and not answered.
	last    map[engine.SeqID]int32
	opening map[engine.SeqID]struct{}
	one     [1]int32
}

var (
	_ engine.Model     = (*PrefixCache)(nil)
	_ engine.BlockPool = (*PrefixCache)(nil)
)

// FreeBlocks passes on the wrapped model's free KV blocks (see
// engine.BlockPool), so a batcher admits by blocks through the cache;
// zero when the model does not page.
func (c *PrefixCache) FreeBlocks() int {
	if p, ok := c.m.(engine.BlockPool); ok && c.m.Info().Paged() {
		return p.FreeBlocks()
	}
	return 0
}

// CheckCacheOptions applies opts to a default configuration and returns
// the first option's error, so a program that builds prefix caches later
// (at each model load) can refuse bad options up front.
func CheckCacheOptions(opts ...CacheOption) error {
	cfg := cacheConfig{block: DefaultBlockSize}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return err
		}
	}
	return nil
}

// NewPrefixCache wraps m. Close closes m.
func NewPrefixCache(m engine.Model, opts ...CacheOption) (*PrefixCache, error) {
	if m == nil {
		return nil, errors.New("session: nil model")
	}
	cfg := cacheConfig{block: DefaultBlockSize}
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.budget == 0 {
		cfg.budget = max(m.Info().KVCapacity, 1)
	}
	c := &PrefixCache{m: m, cfg: cfg, idx: NewIndex(cfg.block), seqs: map[engine.SeqID]*Hasher{},
		last: map[engine.SeqID]int32{}, opening: map[engine.SeqID]struct{}{}}
	c.lru = c.newLRU()
	c.sk, _ = m.(engine.SavedKV)
	return c, nil
}

// Model returns the wrapped model.
func (c *PrefixCache) Model() engine.Model { return c.m }

// Info describes the wrapped model.
func (c *PrefixCache) Info() engine.Info { return c.m.Info() }

// NewKey returns a fresh key to save a sequence's KV under when it has no
// session: Free with it makes the KV findable by later prompts.
func (c *PrefixCache) NewKey() string {
	return "prefix:" + strconv.FormatUint(c.keys.Add(1), 36)
}

// Open starts sequence id, reusing the saved KV that shares the longest
// prefix with prompt: key's when it shares as much as the best indexed
// entry, else the best entry's.
func (c *PrefixCache) Open(ctx context.Context, id engine.SeqID, prompt []int32, key string) (int, error) {
	return c.open(id, prompt, key, "", func(chosen string) (int, error) { return c.m.Open(ctx, id, prompt, chosen) })
}

// OpenAdapter is Open for a sequence of a LoRA adapter of the wrapped
// model (see engine.AdapterModel): it reuses only KV saved by the same
// adapter's sequences.
func (c *PrefixCache) OpenAdapter(ctx context.Context, id engine.SeqID, prompt []int32, key, adapter string) (int, error) {
	if adapter == "" {
		return c.Open(ctx, id, prompt, key)
	}
	am, err := c.adapters()
	if err != nil {
		return 0, err
	}
	return c.open(id, prompt, key, adapter, func(chosen string) (int, error) {
		return am.OpenAdapter(ctx, id, prompt, chosen, adapter)
	})
}

// open opens id through openIn, given the key it chose among the KV saved
// by adapter's sequences (the base's for "").
func (c *PrefixCache) open(id engine.SeqID, prompt []int32, key, adapter string, openIn func(chosen string) (int, error)) (int, error) {
	chosen, predicted := c.lookup(prompt, key, adapter)
	r, err := openIn(chosen)
	if err != nil {
		return r, err
	}
	c.opened(id, prompt, adapter, chosen, predicted, r)
	return r, nil
}

// lookup passes the engine the keys dropped since the last call, takes
// its evictions out of the index (a worker may have died since: its keys
// leave first), and chooses the key an open of prompt passes the engine
// (see choose).
func (c *PrefixCache) lookup(prompt []int32, key, adapter string) (chosen string, predicted int) {
	c.applyDrops()
	c.collect()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.choose(prompt, key, adapter)
}

// opened records an open that reused r tokens of the KV saved under
// chosen, where the index predicted it would reuse predicted.
func (c *PrefixCache) opened(id engine.SeqID, prompt []int32, adapter, chosen string, predicted, r int) {
	h := NewAdapterHasher(c.cfg.block, adapter)
	h.Write(prompt[:r])
	c.seqs[id] = h
	c.mu.Lock()
	c.stats.Lookups++
	c.stats.Queries += int64(len(prompt))
	c.stats.Hits += int64(r)
	if r > 0 {
		c.stats.LookupHits++
	}
	// A model that reports its evictions keeps the index exact: a miss
	// there means the sequence ran where the entry is not (another
	// worker), not that the entry is gone. For one that does not, the
	// first miss shows the entry is gone.
	if c.sk == nil && chosen != "" && r == 0 && predicted > 0 && c.idx.Remove(chosen) {
		c.lru.Remove(chosen)
		c.stats.Stale++
	}
	c.mu.Unlock()
	c.collect()
}

// choose picks the key to pass the engine and the tokens the index
// expects it to cover. Has to be called with c.mu held.
func (c *PrefixCache) choose(prompt []int32, key, adapter string) (string, int) {
	best, n := c.idx.LookupAdapter(prompt, adapter)
	if key != "" && c.idx.Has(key) {
		if m := c.idx.MatchAdapter(key, prompt, adapter); m >= n {
			c.lru.Get(key)
			return key, m
		}
	}
	if n > 0 {
		c.lru.Get(best)
		return best, n
	}
	return key, 0
}

// Step runs the wrapped model's step and hashes what each sequence was
// fed: every input after a step that succeeded, those that ran after one
// that ran in part (engine.PartialStepError).
func (c *PrefixCache) Step(ctx context.Context, batch []engine.StepInput) ([]engine.StepOutput, error) {
	out, err := c.m.Step(ctx, batch)
	ran, _, ok := stepRan(out, err)
	if !ok {
		return out, err
	}
	for i := range batch {
		if h := c.seqs[batch[i].Seq]; h != nil && (ran == nil || ran[i]) {
			h.Write(batch[i].Tokens)
		}
	}
	return out, err
}

// stepRan reads a step's result: ok when some of its inputs ran, ran
// saying which (nil: all) and outs holding their outputs.
func stepRan(out []engine.StepOutput, err error) (ran []bool, outs []engine.StepOutput, ok bool) {
	var part *engine.PartialStepError
	switch {
	case err == nil:
		return nil, out, true
	case errors.As(err, &part):
		return part.Ran, part.Outputs, true
	}
	return nil, nil, false
}

// OpenPooled opens an embedding sequence on the wrapped model (see
// engine.Embedder); it reuses and saves no prefix, so the index does not
// see it.
func (c *PrefixCache) OpenPooled(ctx context.Context, id engine.SeqID, input []int32, pool engine.Pooling) error {
	e, ok := c.m.(engine.Embedder)
	if !ok {
		return &engine.InvalidParamError{Param: "model", Reason: fmt.Sprintf("model %q does not embed", c.m.Info().ID)}
	}
	return e.OpenPooled(ctx, id, input, pool)
}

// Free releases sequence id; with saveKey the engine keeps its KV and the
// index learns the tokens it holds.
func (c *PrefixCache) Free(id engine.SeqID, saveKey string) {
	h := c.seqs[id]
	delete(c.seqs, id)
	delete(c.last, id)
	delete(c.opening, id)
	c.applyDrops()
	c.m.Free(id, saveKey)
	if saveKey != "" && h != nil && h.Tokens() > 0 {
		c.mu.Lock()
		c.idx.Insert(saveKey, h.Hashes(), h.Tokens())
		c.lru.Add(saveKey, struct{}{}, int64(h.Tokens()))
		drops := c.dropped
		c.dropped = nil
		c.mu.Unlock()
		if c.sk != nil {
			for _, k := range drops {
				c.sk.DropSaved(k)
			}
		}
		if c.cfg.onSaved != nil {
			worker := -1
			if wl, ok := c.m.(engine.WorkerLocator); ok {
				worker = wl.SavedWorker(saveKey)
			}
			c.cfg.onSaved(saveKey, worker)
		}
	}
	c.collect()
}

// newLRU returns the cache's LRU: past the token budget the least
// recently used entries leave the index, their keys kept in c.dropped for
// the engine. Its callback runs with c.mu held.
func (c *PrefixCache) newLRU() *lru.LRU[string, struct{}] {
	return lru.New(int64(c.cfg.budget), 0, func(k string, _ struct{}) {
		c.idx.Remove(k)
		c.stats.Dropped++
		c.dropped = append(c.dropped, k)
	})
}

// Drop forgets key and has the engine drop its saved KV before the next
// Open, Step or Free. Safe for concurrent use.
func (c *PrefixCache) Drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idx.Remove(key) {
		c.lru.Remove(key)
		c.stats.Dropped++
	}
	if c.pending == nil {
		c.pending = map[string]struct{}{}
	}
	c.pending[key] = struct{}{} // a key dropped again before the loop runs is dropped once
}

// applyDrops passes the keys dropped since the last call to the engine.
func (c *PrefixCache) applyDrops() {
	c.mu.Lock()
	p := c.pending
	c.pending = nil
	c.mu.Unlock()
	if c.sk == nil {
		return
	}
	for k := range p {
		c.sk.DropSaved(k)
	}
}

// collect takes the engine's evictions out of the index.
func (c *PrefixCache) collect() {
	if c.sk == nil {
		return
	}
	ev := c.sk.EvictedSaved()
	if len(ev) == 0 {
		return
	}
	c.mu.Lock()
	for _, k := range ev {
		if c.idx.Remove(k) {
			c.lru.Remove(k)
		}
		c.stats.Evicted++
	}
	c.mu.Unlock()
	if c.cfg.onLost != nil {
		for _, k := range ev {
			c.cfg.onLost(k)
		}
	}
}

// Stats returns the counters. Safe for concurrent use.
func (c *PrefixCache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stats
	st.Keys, st.Tokens = c.idx.Len(), c.idx.Tokens()
	return st
}

// Close closes the wrapped model and empties the index.
func (c *PrefixCache) Close() error {
	c.mu.Lock()
	c.idx = NewIndex(c.cfg.block)
	c.lru = c.newLRU()
	c.pending = nil
	c.mu.Unlock()
	return c.m.Close()
}

// adapters returns the wrapped model as an engine.AdapterModel, or an
// *engine.InvalidParamError when it serves no adapters.
func (c *PrefixCache) adapters() (engine.AdapterModel, error) {
	am, ok := c.m.(engine.AdapterModel)
	if !ok || c.m.Info().AdapterSlots <= 0 {
		return nil, &engine.InvalidParamError{Param: "model", Reason: fmt.Sprintf("model %q serves no LoRA adapters", c.m.Info().ID)}
	}
	return am, nil
}

// AddAdapter adds a LoRA adapter to the wrapped model (see
// engine.AdapterModel).
func (c *PrefixCache) AddAdapter(ctx context.Context, spec engine.AdapterSpec) (engine.AdapterInfo, error) {
	am, err := c.adapters()
	if err != nil {
		return engine.AdapterInfo{}, err
	}
	return am.AddAdapter(ctx, spec)
}

// RemoveAdapter removes a LoRA adapter from the wrapped model.
func (c *PrefixCache) RemoveAdapter(name string) error {
	am, err := c.adapters()
	if err != nil {
		return err
	}
	return am.RemoveAdapter(name)
}

// Adapters lists the wrapped model's adapters.
func (c *PrefixCache) Adapters() []engine.AdapterInfo {
	am, err := c.adapters()
	if err != nil {
		return nil
	}
	return am.Adapters()
}

package enginetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/lru"
)

// simModel is one model loaded by a Sim. Its state sits behind mu, held
// for the whole of every call including a Step's simulated compute time:
// the contract has callers serialise Open, Step and Free anyway, and a
// caller that breaks that rule gets serialised rather than corrupted
// state. Close first closes done, which ends a Step's wait at once.
type simModel struct {
	sim  *Sim
	info engine.Info
	pick picker

	closeOnce sync.Once
	done      chan struct{}

	mu      sync.Mutex
	closed  bool
	seqs    map[engine.SeqID]*simSeq
	kv      int // KV tokens held by open sequences
	blocks  int // KV blocks held by open sequences (paged models)
	saves   *lru.LRU[string, []int32]
	evicted []string    // saved keys the LRU bound pushed out, for EvictedSaved
	stamp   uint64      // counts Steps; marks sequences seen in the current one
	scratch []*simSeq   // the current batch's sequences, reused across Steps
	timer   *time.Timer // the Step wait timer, reused across Steps
	warm    uint64      // bit b set: the bucket of batch size 1<<b has run

	adapters     map[string]*simAdapter // served LoRA adapters (adapter.go)
	resident     int                    // adapters holding a slot
	adapterClock uint64                 // counts OpenAdapter calls, for LRU eviction

	// pending are the steps StepAsync sent whose Wait has not begun to
	// return, oldest first: two at most (pipeline.go).
	pending []*simPending
	// busy is when the simulated device finishes the last step sent: a
	// step sent behind it starts then.
	busy time.Time
	// resolved and prevTokens are scratch for a batch with Prev inputs.
	resolved   []engine.StepInput
	prevTokens []int32
	// openFailed holds the sequences whose OpenAsync failed, until Free:
	// an Opening input of theirs in a step sent behind it feeds nothing
	// (engine.StepInput.Opening); failedRows are the sampling inputs of
	// the batch being run that resolve dropped so.
	openFailed map[engine.SeqID]bool
	failedRows []int
}

// simSeq is an open sequence.
type simSeq struct {
	hash   uint64  // rolling hash of tokens
	tokens []int32 // every token fed, kept for saving under a prefix key
	// held is the KV tokens reserved: the prompt's length, or more once
	// fed past it; on a paged model, the tokens fed (blocks are taken as
	// the sequence grows).
	held  int
	seed  uint64 // sampling seed when the params carry none
	stamp uint64 // the last Step that carried this sequence
	// sampled is set once the sequence has sampled; tokens fed after that
	// are generated and gen counts them, for presence and frequency
	// penalties.
	sampled bool
	gen     map[int32]int
	// draws is the generated position of the next sample: the count of
	// samples since Open, plus the tokens fed with them after the first
	// (forced by jump-forward decoding), plus SamplingParams.Generated.
	draws int
	// lost is set when a simulated worker loss took the sequence.
	lost bool
	// pool is set for an embedding sequence (OpenPooled): sum holds its
	// pooled hidden states so far (their sum for PoolMean), pooled counts
	// the tokens it pooled.
	pool   engine.Pooling
	sum    []float64
	pooled int
	// adapter is the LoRA adapter the sequence runs with; nil: the base.
	adapter *simAdapter
	// unfed is the token the sequence sampled last and no input has fed
	// since, and unfedAt the stamp of the step that sampled it; zero when
	// there is none. A Prev input feeds it (pipeline.go).
	unfed   int32
	unfedAt uint64
	// opening is set from OpenAsync until its PendingOpen's Wait: the
	// sequence may not be stepped before, but by an Opening input.
	opening bool
	// fresh is set from Open until the first input that reaches the
	// sequence: an Opening input may come only then, its tokens starting
	// with the reused prefix the sequence holds.
	fresh bool
}

// Info describes the model. It is safe for concurrent use.
func (m *simModel) Info() engine.Info {
	info := m.info
	info.EOS = slices.Clone(m.info.EOS)
	return info
}

// Open starts sequence id for prompt, reserving len(prompt) KV tokens and
// reusing the tokens saved under prefixKey when they start the prompt.
func (m *simModel) Open(ctx context.Context, id engine.SeqID, prompt []int32, prefixKey string) (int, error) {
	if m.info.Encoder {
		return 0, &engine.InvalidParamError{Param: "model", Reason: fmt.Sprintf("model %q is an encoder: it embeds and does not generate", m.info.ID)}
	}
	return m.open(ctx, id, prompt, prefixKey, false)
}

// open is Open for generating and embedding sequences alike; async is
// set for OpenAsync, which may run while a step is pending and leaves the
// sequence opening until its Wait.
func (m *simModel) open(ctx context.Context, id engine.SeqID, prompt []int32, prefixKey string, async bool) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.closed:
		return 0, fmt.Errorf("enginetest: model %q: open: %w", m.info.ID, engine.ErrClosed)
	case !async && len(m.pending) > 0:
		return 0, m.pendingError("Open")
	case len(prompt) == 0:
		return 0, &engine.InvalidParamError{Param: "prompt", Reason: "the prompt is empty"}
	case m.seqs[id] != nil:
		return 0, &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d is already open", id)}
	case len(prompt) > m.info.ContextLength:
		return 0, &engine.ContextLengthError{Model: m.info.ID, Prompt: len(prompt), Limit: m.info.ContextLength}
	}
	if err := m.checkTokens(prompt); err != nil {
		return 0, err
	}
	reused := m.reuse(prompt, prefixKey)
	held := len(prompt)
	if m.info.Paged() {
		held = reused
		if need := m.info.BlocksFor(held); m.blocks+need > m.info.KVBlocks {
			return 0, fmt.Errorf("enginetest: model %q: sequence %d needs %d KV blocks, %d of %d are free: %w",
				m.info.ID, id, need, m.info.KVBlocks-m.blocks, m.info.KVBlocks, engine.ErrOutOfMemory)
		}
	} else if m.kv+held > m.info.KVCapacity {
		return 0, fmt.Errorf("enginetest: model %q: sequence %d needs %d KV tokens, %d of %d are free: %w",
			m.info.ID, id, held, m.info.KVCapacity-m.kv, m.info.KVCapacity, engine.ErrOutOfMemory)
	}
	seq := &simSeq{tokens: make([]int32, reused, len(prompt)+64), held: held, seed: m.sim.newSeed(), opening: async, fresh: true}
	copy(seq.tokens, prompt[:reused])
	seq.hash = feed(hashStart, seq.tokens)
	m.seqs[id] = seq
	m.kv += held
	m.blocks += m.info.BlocksFor(held)
	m.sim.stats.kv.Add(int64(held))
	m.sim.stats.open.Add(1)
	return reused, nil
}

// reuse returns how many of prompt's tokens the save under key covers:
// the longest common prefix of the saved tokens and prompt, but never the
// whole prompt.
func (m *simModel) reuse(prompt []int32, key string) int {
	if key == "" {
		return 0
	}
	saved, ok := m.saves.Get(key)
	if !ok {
		return 0
	}
	return min(commonPrefix(saved, prompt), len(prompt)-1)
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b []int32) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// DropSaved discards the tokens saved under key; see [engine.SavedKV].
func (m *simModel) DropSaved(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.saves.Remove(key)                // Remove is no eviction: EvictedSaved does not report it
	for _, k := range m.saves.Keys() { // the same key saved by adapters' sequences
		if strings.Contains(k, adapterKeySep) && callerKey(k) == key {
			m.saves.Remove(k)
		}
	}
}

// EvictedSaved returns the keys the prefix cache's bound evicted since the
// last call; see [engine.SavedKV].
func (m *simModel) EvictedSaved() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := m.evicted
	m.evicted = nil
	return out
}

// onEvict records a save the LRU bound pushed out. It runs inside the
// cache's calls, with m.mu held.
func (m *simModel) onEvict(key string, _ []int32) {
	m.evicted = append(m.evicted, callerKey(key))
}

// checkTokens refuses ids outside the vocabulary.
func (m *simModel) checkTokens(tokens []int32) error {
	for _, t := range tokens {
		if t < 0 || int(t) >= m.info.VocabSize {
			return &engine.InvalidParamError{Param: "tokens",
				Reason: fmt.Sprintf("token id %d is outside the vocabulary [0, %d)", t, m.info.VocabSize)}
		}
	}
	return nil
}

// Free releases sequence id, keeping its tokens under saveKey if set.
func (m *simModel) Free(id engine.SeqID, saveKey string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	seq := m.seqs[id]
	delete(m.openFailed, id)
	if m.closed || seq == nil {
		return
	}
	delete(m.seqs, id)
	m.noteWasted(id)
	m.release(seq)
	m.kv -= seq.held
	m.blocks -= m.info.BlocksFor(seq.held)
	m.sim.stats.kv.Add(-int64(seq.held))
	m.sim.stats.open.Add(-1)
	if saveKey != "" && len(seq.tokens) > 0 && seq.pool == engine.PoolNone {
		if seq.adapter != nil {
			saveKey = savedKey(seq.adapter.info.Name, saveKey)
		}
		m.saves.Add(saveKey, seq.tokens, 1)
	}
}

// Close frees every sequence and saved prefix. Later calls return
// engine.ErrClosed; Close is idempotent.
func (m *simModel) Close() error {
	m.closeOnce.Do(func() { close(m.done) })
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	m.sim.stats.kv.Add(-int64(m.kv))
	m.sim.stats.open.Add(-int64(len(m.seqs)))
	m.sim.stats.models.Add(-1)
	m.kv, m.blocks, m.seqs, m.scratch, m.pending = 0, 0, nil, nil, nil
	m.adapters, m.resident = nil, 0
	m.saves.Purge()
	m.evicted = nil // the purge's, which are no evictions
	m.sim.forget(m)
	return nil
}

// FreeBlocks returns the blocks no open sequence holds on a paged model
// (see [WithBlockSize] and [engine.BlockPool]); zero when the model does
// not page or is closed. While steps sent by StepAsync are pending it
// reports the pool as a worker's last reply would: without the blocks
// those steps take (the caller subtracts them), with the blocks of every
// sequence freed so far. It never waits.
func (m *simModel) FreeBlocks() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || !m.info.Paged() {
		return 0
	}
	free := m.info.KVBlocks - m.blocks
	for _, p := range m.pending {
		free += p.grow
	}
	return free
}

var (
	_ engine.Model     = (*simModel)(nil)
	_ engine.SavedKV   = (*simModel)(nil)
	_ engine.BlockPool = (*simModel)(nil)
)

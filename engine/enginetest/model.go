package enginetest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/mlxserving/mlxserving/engine"
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
	saves   *lru.Cache[string, []int32]
	stamp   uint64      // counts Steps; marks sequences seen in the current one
	scratch []*simSeq   // the current batch's sequences, reused across Steps
	timer   *time.Timer // the Step wait timer, reused across Steps
	warm    uint64      // bit b set: the bucket of batch size 1<<b has run
}

// simSeq is an open sequence.
type simSeq struct {
	hash   uint64  // rolling hash of tokens
	tokens []int32 // every token fed, kept for saving under a prefix key
	held   int     // KV tokens reserved: the prompt's length, or more once fed past it
	seed   uint64  // sampling seed when the params carry none
	stamp  uint64  // the last Step that carried this sequence
	// sampled is set once the sequence has sampled; tokens fed after that
	// are generated and gen counts them, for presence and frequency
	// penalties.
	sampled bool
	gen     map[int32]int
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
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.closed:
		return 0, fmt.Errorf("enginetest: model %q: open: %w", m.info.ID, engine.ErrClosed)
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
	if m.kv+len(prompt) > m.info.KVCapacity {
		return 0, fmt.Errorf("enginetest: model %q: sequence %d needs %d KV tokens, %d of %d are free: %w",
			m.info.ID, id, len(prompt), m.info.KVCapacity-m.kv, m.info.KVCapacity, engine.ErrOutOfMemory)
	}
	reused := m.reuse(prompt, prefixKey)
	seq := &simSeq{tokens: make([]int32, reused, len(prompt)+64), held: len(prompt), seed: m.sim.newSeed()}
	copy(seq.tokens, prompt[:reused])
	seq.hash = feed(hashStart, seq.tokens)
	m.seqs[id] = seq
	m.kv += len(prompt)
	m.sim.stats.kv.Add(int64(len(prompt)))
	m.sim.stats.open.Add(1)
	return reused, nil
}

// reuse returns how many of prompt's tokens the save under key covers:
// all of the saved tokens when they are a prefix of prompt, but never the
// whole prompt.
func (m *simModel) reuse(prompt []int32, key string) int {
	if key == "" {
		return 0
	}
	saved, ok := m.saves.Get(key)
	if !ok || len(saved) > len(prompt) || !slices.Equal(saved, prompt[:len(saved)]) {
		return 0
	}
	return min(len(saved), len(prompt)-1)
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
	if m.closed || seq == nil {
		return
	}
	delete(m.seqs, id)
	m.kv -= seq.held
	m.sim.stats.kv.Add(-int64(seq.held))
	m.sim.stats.open.Add(-1)
	if saveKey != "" && len(seq.tokens) > 0 {
		m.saves.Add(saveKey, seq.tokens)
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
	m.kv, m.seqs, m.scratch = 0, nil, nil
	m.saves.Purge()
	m.sim.forget(m)
	return nil
}

//go:build mlx

package mlx

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/metal"
)

// model is a loaded checkpoint. Its state is touched only on the engine's
// MLX thread; the caller serialises Open, Step and Free as engine.Model
// requires.
type model struct {
	eng     *Engine
	cfg     *modelConfig
	info    engine.Info
	w       *weights
	lay     *kvLayout // how the layers share the pool's rows
	rows    []int     // the pool's rows in each group of lay
	pool    *kvPool
	seqs    map[engine.SeqID]*seqState
	saved   []*savedKV // least recently used first
	evicted []string   // saved keys evicted since the last EvictedSaved
	closed  atomic.Bool
	// adapters serves LoRA adapters (adapter.go, lora.go).
	adapters *adapters

	prims PrimitiveCount // of the last step
}

var (
	_ engine.Model     = (*model)(nil)
	_ engine.SavedKV   = (*model)(nil)
	_ engine.BlockPool = (*model)(nil)
)

// savedKV is a freed sequence's cache kept for prefix reuse. Its rows
// count as free (kvPool.park) until it is evicted. It is found by its key
// and the adapter its sequence ran (seq.lora; nil for the base): KV is
// never shared between adapters.
type savedKV struct {
	key string
	seq *seqState
}

// free returns the saved rows no sequence shares to the pool.
func (e *savedKV) free() {
	if e.seq.pool != nil {
		e.seq.pool.dropSaved(e.seq)
	}
}

// Info describes the model.
func (m *model) Info() engine.Info { return m.info }

// call runs job on the MLX thread, or returns ErrClosed.
func (m *model) call(job func(*graph) error) error { return m.eng.runOpen(&m.closed, job) }

// Open starts a sequence; see engine.Model.
func (m *model) Open(ctx context.Context, id engine.SeqID, prompt []int32, prefixKey string) (int, error) {
	return m.open(ctx, id, prompt, prefixKey, nil)
}

// open starts a sequence of adapter e (nil: the base), making e resident.
func (m *model) open(ctx context.Context, id engine.SeqID, prompt []int32, prefixKey string, e *adapterEntry) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if len(prompt) == 0 {
		return 0, &engine.InvalidParamError{Param: "prompt", Reason: "empty"}
	}
	if len(prompt) > m.info.ContextLength {
		return 0, &engine.ContextLengthError{Model: m.info.ID, Prompt: len(prompt), Limit: m.info.ContextLength}
	}
	if m.cfg.headless() {
		return 0, &engine.InvalidParamError{Param: "model", Reason: fmt.Sprintf("%s has no output head (a bare %s model): it only embeds", m.info.ID, m.cfg.Arch)}
	}
	reused := 0
	err := m.call(func(g *graph) error {
		if _, dup := m.seqs[id]; dup {
			return &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d is already open", id)}
		}
		m.dropGoneSaved()
		m.relieve()
		s := &seqState{lora: e}
		if e != nil {
			slot, err := m.resident(g, e)
			if err != nil {
				return err
			}
			s.slot, s.inSlot = slot, true
		}
		if prefixKey != "" {
			reused = m.attach(s, prompt, prefixKey)
		}
		m.seqs[id] = s
		return g.err
	})
	return reused, err
}

// attach gives s the KV saved under key by a sequence of s's adapter
// (never another's: KV is not shared between adapters), truncated to the
// longest common prefix of its tokens and prompt, and returns that length
// (always fewer than the prompt). s shares the saved entry's pool rows
// for those positions; rows are written once, so the saved entry stays
// whole. A saved entry of a model with sliding groups keeps only its last
// positions there: reuse needs the window of the prompt's next position,
// so a prompt that leaves the saved tokens more than windowSlack before
// their end reuses nothing and recomputes. The shared rows are s's blocks (engine.BlockPool): FreeBlocks
// stops counting those no other sequence held.
func (m *model) attach(s *seqState, prompt []int32, key string) int {
	i := slices.IndexFunc(m.saved, func(e *savedKV) bool { return e.key == key && e.seq.lora == s.lora })
	if i < 0 {
		return 0
	}
	e := m.saved[i]
	n := min(commonPrefix(e.seq.tokens, prompt), len(prompt)-1)
	if n <= 0 || !m.pool.canShare(e.seq, n) {
		return 0 // nothing in common, or a window the saved rows no longer hold: recompute
	}
	m.saved = append(slices.Delete(m.saved, i, i+1), e) // most recently used
	s.tokens = slices.Clone(prompt[:n])
	m.pool.share(s, e.seq, n)
	return n
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

// DropSaved discards the KV saved under key, by the base and every
// adapter; see engine.SavedKV.
func (m *model) DropSaved(key string) {
	_ = m.call(func(*graph) error {
		m.saved = slices.DeleteFunc(m.saved, func(e *savedKV) bool {
			if e.key == key {
				e.free()
				return true
			}
			return false
		})
		return nil
	})
}

// EvictedSaved returns the keys evicted for memory or by the prefix-slot
// bound since the last call; see engine.SavedKV.
func (m *model) EvictedSaved() []string {
	var out []string
	_ = m.call(func(*graph) error {
		out, m.evicted = m.evicted, nil
		return nil
	})
	return out
}

// evictOldest frees the least recently used saved entry and records its
// key for EvictedSaved.
func (m *model) evictOldest() {
	m.saved[0].free()
	m.evicted = append(m.evicted, m.saved[0].key)
	m.saved = m.saved[1:]
}

// Free releases a sequence; see engine.Model.
func (m *model) Free(id engine.SeqID, saveKey string) {
	_ = m.call(func(*graph) error {
		s, ok := m.seqs[id]
		if !ok {
			return nil
		}
		delete(m.seqs, id)
		m.release(s)
		if s.embed != nil { // embedding sequences are never saved (engine.Embedder)
			s.free()
			return nil
		}
		if saveKey == "" || m.eng.opts.prefixSlots == 0 || len(s.tokens) == 0 {
			s.free()
			if saveKey != "" { // asked to save and did not: say so, as for an eviction
				m.evicted = append(m.evicted, saveKey)
			}
			return nil
		}
		m.save(saveKey, s)
		return nil
	})
}

// save keeps the freed sequence s under key, replacing what a sequence
// of the same adapter saved under it; its rows count as free from now on.
func (m *model) save(key string, s *seqState) {
	if i := slices.IndexFunc(m.saved, func(e *savedKV) bool { return e.key == key && e.seq.lora == s.lora }); i >= 0 {
		m.saved[i].free()
		m.saved = slices.Delete(m.saved, i, i+1)
	}
	if s.pool != nil {
		s.pool.park(s)
	}
	m.saved = append(m.saved, &savedKV{key: key, seq: s})
	for len(m.saved) > m.eng.opts.prefixSlots {
		m.evictOldest()
	}
	m.relieve()
}

// relieve evicts saved prefixes, least recently used first, while MLX's
// active memory is above 90% of its limit: saved KV gives way to live
// sequences.
func (m *model) relieve() {
	for len(m.saved) > 0 {
		mem, err := metal.ReadMemory()
		if err != nil {
			return
		}
		limit, err := metal.MemoryLimit()
		if err != nil || mem.Active <= limit/10*9 {
			return
		}
		m.evictOldest()
	}
}

// Close unloads the model; see engine.Model.
func (m *model) Close() error {
	err := m.call(func(*graph) error {
		m.unload()
		delete(m.eng.models, m)
		return nil
	})
	if err == engine.ErrClosed {
		return nil
	}
	return err
}

// unload frees everything the model holds. MLX thread only.
func (m *model) unload() {
	if m.closed.Swap(true) {
		return
	}
	for _, s := range m.seqs {
		s.free()
	}
	for _, e := range m.saved {
		e.free()
	}
	m.seqs, m.saved, m.evicted = nil, nil, nil
	m.pool.release()
	if m.adapters != nil {
		m.adapters.stack.free()
	}
	m.w.free()
}

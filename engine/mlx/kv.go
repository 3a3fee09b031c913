//go:build mlx

package mlx

/*
#include "mlx/c/mlx.h"
*/
import "C"

import (
	"fmt"

	"github.com/mlxserving/mlxserving/engine"
)

// kvPool is a model's KV cache: one array per layer, [2*rows*kvHeads,
// headDim] in the weights' dtype, keys first (token row r's head h at
// r*kvHeads+h) and values after them (at vOff+r*kvHeads+h), allocated once
// at load with a row per token of Info.KVCapacity. A sequence holds a row
// per position (seqState.rows), taken as it is fed; a step writes its new
// tokens' keys and values with one scatter per layer and attention gathers
// each sequence's rows, so the cache never grows or concatenates. Rows are
// reference-counted: a saved prefix and the sequences that reuse it share
// their rows.
//
// The pool is the model's engine.BlockPool with blocks of one row
// (Info.BlockSize 1): a row is held while a live sequence references it;
// rows referenced only by saved prefixes count as free and go back to the
// free list when their last saved prefix is evicted.
type kvPool struct {
	kv   []arr
	vOff int32   // first value row: rows*kvHeads
	free []int32 // rows nobody holds, taken from the end
	refs []int32 // holders of each row: sequences and saved prefixes
	live []int32 // holders of each row that are sequences, not saved prefixes
	held int     // rows with a live holder: the blocks FreeBlocks does not count
}

// newPool allocates and zeroes the pool for rows tokens. MLX thread only.
func newPool(g *graph, c *modelConfig, dt C.mlx_dtype, rows int) *kvPool {
	p := &kvPool{kv: make([]arr, c.Layers), vOff: int32(rows * c.KVHeads),
		free: make([]int32, rows), refs: make([]int32, rows), live: make([]int32, rows)}
	for i := range p.free {
		p.free[i] = int32(rows - 1 - i) // row 0 first
	}
	for l := range p.kv {
		p.kv[l] = g.keep(g.zeros(dt, 2*rows*c.KVHeads, c.HeadDim))
	}
	g.eval(p.kv...)
	return p
}

func (p *kvPool) release() {
	for l := range p.kv {
		free(&p.kv[l])
	}
}

// available is the rows sequences can take: free ones and those held only
// by saved prefixes (engine.BlockPool.FreeBlocks).
func (p *kvPool) available() int { return len(p.refs) - p.held }

// take moves n free rows to the live sequence s. It reports false, and
// takes nothing, when fewer are free.
func (p *kvPool) take(s *seqState, n int) bool {
	if len(p.free) < n {
		return false
	}
	got := p.free[len(p.free)-n:]
	for _, r := range got {
		p.refs[r], p.live[r] = 1, 1
	}
	p.held += n
	s.rows = append(s.rows, got...)
	s.pool = p
	p.free = p.free[:len(p.free)-n]
	return true
}

// share gives the new live sequence s the first n rows of from. Rows only
// saved prefixes held until now stop counting as free.
func (p *kvPool) share(s *seqState, from *seqState, n int) {
	for _, r := range from.rows[:n] {
		p.refs[r]++
		if p.live[r]++; p.live[r] == 1 {
			p.held++
		}
	}
	s.rows = append(s.rows[:0], from.rows[:n]...)
	s.pool = p
}

// drop releases the live sequence s's rows from position n on.
func (p *kvPool) drop(s *seqState, n int) {
	for _, r := range s.rows[n:] {
		if p.live[r]--; p.live[r] == 0 {
			p.held--
		}
		p.unref(r)
	}
	s.rows = s.rows[:n]
}

// park turns the live sequence s into a saved prefix: its rows stay in
// the pool, and those no live sequence shares count as free.
func (p *kvPool) park(s *seqState) {
	for _, r := range s.rows {
		if p.live[r]--; p.live[r] == 0 {
			p.held--
		}
	}
}

// dropSaved releases the rows of s, a saved prefix (park).
func (p *kvPool) dropSaved(s *seqState) {
	for _, r := range s.rows {
		p.unref(r)
	}
	s.rows = s.rows[:0]
}

// unref drops one holder of row r, freeing it with the last.
func (p *kvPool) unref(r int32) {
	if p.refs[r]--; p.refs[r] == 0 {
		p.free = append(p.free, r)
	}
}

// FreeBlocks returns the KV rows (blocks of one token) sequences can take
// now, counting rows held only by saved prefixes; see engine.BlockPool.
// Zero after Close.
func (m *model) FreeBlocks() int {
	n := 0
	_ = m.call(func(*graph) error {
		n = m.pool.available()
		return nil
	})
	return n
}

// rowsFor gives every feed rows for its new tokens, evicting saved
// prefixes (least recently used first) when too few rows are free. A
// step that needs more rows than FreeBlocks fails with
// engine.ErrOutOfMemory before anything is taken or evicted. Scratch
// sequences (Warm's, not open in m.seqs) take only free rows and evict
// nothing. MLX thread only.
func (m *model) rowsFor(feeds []feed) error {
	need, scratch := 0, false
	for _, f := range feeds {
		need += len(f.tokens)
		scratch = scratch || m.seqs[f.id] != f.seq
	}
	have := m.pool.available()
	if scratch {
		have = len(m.pool.free)
	}
	if need > have {
		return fmt.Errorf("mlx: %s: KV cache has %d free rows, the step needs %d: %w",
			m.info.ID, have, need, engine.ErrOutOfMemory)
	}
	for len(m.pool.free) < need && len(m.saved) > 0 {
		m.evictOldest() // saved prefixes hold the missing rows
	}
	for i, f := range feeds {
		if !m.pool.take(f.seq, len(f.tokens)) { // only if the counts were wrong
			for _, g := range feeds[:i] {
				m.pool.drop(g.seq, len(g.seq.tokens))
			}
			return fmt.Errorf("mlx: %s: KV cache has %d free rows after evicting every saved prefix, the step needs %d: %w",
				m.info.ID, len(m.pool.free), need, engine.ErrOutOfMemory)
		}
	}
	return nil
}

// writeKV stores the step's keys and values, upd [2*N*kvHeads, 1,
// headDim] (every token's key heads, then every token's value heads),
// into layer li's pool at rows idx (kvRows). The pool's old handle is
// dropped before evaluation, so MLX updates it in place.
func (m *model) writeKV(g *graph, li int, idx, upd arr) {
	m.replace(g, &m.pool.kv[li], g.scatterRows(m.pool.kv[li], idx, upd))
}

// kvRows is the pool rows [2*N*kvHeads] that a step writes for tokens
// at token rows: each token's key heads, then each token's value heads,
// in writeKV's order. Built on the host once per step.
func (m *model) kvRows(g *graph, rows []int32) arr {
	h, n := int32(m.cfg.KVHeads), len(rows)
	out := make([]int32, 2*n*int(h))
	for i, r := range rows {
		for j := range h {
			at := i*int(h) + int(j)
			out[at] = r*h + j
			out[n*int(h)+at] = m.pool.vOff + r*h + j
		}
	}
	return g.int32s(out, len(out))
}

// headRows turns token rows [B*T] (T per sequence) into the pool's head
// rows [B, kvHeads, T] of keys and of values, so that one take each
// gathers them already in attention's [B, kvHeads, T, D] layout,
// contiguous: MLX's fused decode kernel then reads them without a copy.
// Built on the host once per step and shared by every layer.
func (m *model) headRows(g *graph, rows []int32, b, t int) kvIdx {
	h := m.cfg.KVHeads
	k, v := make([]int32, b*h*t), make([]int32, b*h*t)
	for i := range b {
		for j := range h {
			for x := range t {
				r := rows[i*t+x]*int32(h) + int32(j)
				k[(i*h+j)*t+x], v[(i*h+j)*t+x] = r, r+m.pool.vOff
			}
		}
	}
	return kvIdx{g.int32s(k, b, h, t), g.int32s(v, b, h, t)}
}

// gather reads layer li's keys and values at idx as [B, kvHeads, T, D].
func (m *model) gather(g *graph, li int, idx kvIdx) (arr, arr) {
	return g.take(m.pool.kv[li], idx.k, 0), g.take(m.pool.kv[li], idx.v, 0)
}

// replace swaps a kept handle for a new one. The old buffer is then held
// only by the graph, so MLX can update the pool in place. After a failed
// call it keeps the old handle.
func (m *model) replace(g *graph, h *arr, a arr) {
	if g.err != nil {
		return
	}
	free(h)
	*h = g.keep(a)
}

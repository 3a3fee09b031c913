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
// per position (seqState.rows); a step writes its new tokens' keys and
// values with one scatter per layer and attention gathers each sequence's
// rows, so the cache never grows or concatenates. Rows are
// reference-counted: a saved prefix and the sequences that reuse it share
// their rows.
type kvPool struct {
	kv   []arr
	vOff int32   // first value row: rows*kvHeads
	free []int32 // rows not held by anyone, taken from the end
	refs []int32 // holders of each row
}

// newPool allocates and zeroes the pool for rows tokens. MLX thread only.
func newPool(g *graph, c *modelConfig, dt C.mlx_dtype, rows int) *kvPool {
	p := &kvPool{kv: make([]arr, c.Layers), vOff: int32(rows * c.KVHeads), free: make([]int32, rows), refs: make([]int32, rows)}
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

// take moves n free rows to s. It reports false when fewer are free.
func (p *kvPool) take(s *seqState, n int) bool {
	if len(p.free) < n {
		return false
	}
	got := p.free[len(p.free)-n:]
	for _, r := range got {
		p.refs[r] = 1
	}
	s.rows = append(s.rows, got...)
	s.pool = p
	p.free = p.free[:len(p.free)-n]
	return true
}

// share gives s the first n rows of from.
func (p *kvPool) share(s *seqState, from *seqState, n int) {
	for _, r := range from.rows[:n] {
		p.refs[r]++
	}
	s.rows = append(s.rows[:0], from.rows[:n]...)
	s.pool = p
}

// drop releases s's rows from position n on.
func (p *kvPool) drop(s *seqState, n int) {
	for _, r := range s.rows[n:] {
		if p.refs[r]--; p.refs[r] == 0 {
			p.free = append(p.free, r)
		}
	}
	s.rows = s.rows[:n]
}

// rowsFor gives every feed rows for its new tokens, evicting saved
// prefixes (least recently used first) when the pool is short. The pool
// holds Info.KVCapacity rows and Open admits no more tokens than that, so
// only saved prefixes can be in the way; scratch sequences (Warm) may find
// it full. MLX thread only.
func (m *model) rowsFor(feeds []feed) error {
	for i, f := range feeds {
		for !m.pool.take(f.seq, len(f.tokens)) {
			if len(m.saved) == 0 {
				for _, g := range feeds[:i] {
					m.pool.drop(g.seq, len(g.seq.tokens))
				}
				return fmt.Errorf("mlx: %s: KV cache has %d free rows, the step needs %d: %w",
					m.info.ID, len(m.pool.free), len(f.tokens), engine.ErrOutOfMemory)
			}
			m.evictOldest()
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

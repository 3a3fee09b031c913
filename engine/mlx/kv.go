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

// kvPool is a model's KV cache: one key and one value array per layer,
// each [rows*kvHeads, headDim] in the weights' dtype (token row r's head h
// at r*kvHeads+h), allocated once at load with a row per token of
// Info.KVCapacity. A sequence holds a row per
// position (seqState.rows); a step writes its new tokens' rows with one
// scatter per layer and attention gathers each sequence's rows, so the
// cache never grows or concatenates. Rows are reference-counted: a saved
// prefix and the sequences that reuse it share their rows.
type kvPool struct {
	k, v []arr
	free []int32 // rows not held by anyone, taken from the end
	refs []int32 // holders of each row
}

// newPool allocates and zeroes the pool for rows tokens. MLX thread only.
func newPool(g *graph, c *modelConfig, dt C.mlx_dtype, rows int) *kvPool {
	p := &kvPool{k: make([]arr, c.Layers), v: make([]arr, c.Layers), free: make([]int32, rows), refs: make([]int32, rows)}
	for i := range p.free {
		p.free[i] = int32(rows - 1 - i) // row 0 first
	}
	var all []arr
	for l := range p.k {
		p.k[l] = g.keep(g.zeros(dt, rows*c.KVHeads, c.HeadDim))
		p.v[l] = g.keep(g.zeros(dt, rows*c.KVHeads, c.HeadDim))
		all = append(all, p.k[l], p.v[l])
	}
	g.eval(all...)
	return p
}

func (p *kvPool) release() {
	for l := range p.k {
		free(&p.k[l])
		free(&p.v[l])
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

// writeKV stores the step's keys and values ([N, kvHeads, 1, headDim],
// one row per token) into layer li's pool at head rows idx [N*kvHeads]
// (headRows of the tokens' rows). The pool's old handle is dropped
// before evaluation, so MLX updates it in place.
func (m *model) writeKV(g *graph, li int, idx, k, v arr, n int) {
	c := m.cfg
	m.replace(g, &m.pool.k[li], g.scatterRows(m.pool.k[li], idx, g.reshape(k, n*c.KVHeads, 1, c.HeadDim)))
	m.replace(g, &m.pool.v[li], g.scatterRows(m.pool.v[li], idx, g.reshape(v, n*c.KVHeads, 1, c.HeadDim)))
}

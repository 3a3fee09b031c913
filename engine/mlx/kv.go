//go:build mlx

package mlx

/*
#include "mlx/c/mlx.h"
*/
import "C"

import (
	"fmt"
	"slices"

	"github.com/mlxserving/mlxserving/engine"
)

// kvPool is a model's KV cache: one array per slot of a layer group
// (kvLayout; one per layer without sliding groups), [2*rows*kvHeads,
// headDim] in the weights' dtype, keys first (row r's head h at
// r*kvHeads+h) and values after them (at vOff+r*kvHeads+h), allocated
// once at load with a row per block of Info.KVBlocks, and with sliding
// groups one scratch row more. Layer li uses array slot[li] at its
// group's rows. A sequence holds a row per position in each group
// (seqState.kv), taken as it is fed; a step writes its new tokens' keys
// and values with one scatter per layer and attention gathers each
// sequence's rows, so the cache never grows or concatenates. Rows are
// reference-counted: a saved prefix and the sequences that reuse it share
// their rows.
//
// The pool is the model's engine.BlockPool with blocks of one row
// (Info.BlockSize 1): a row is held while a live sequence references it;
// rows referenced only by saved prefixes count as free and go back to the
// free list when their last saved prefix is evicted. A sliding group
// keeps a sequence's last lay.keep positions after each step (settle);
// its rows are not counted one by one but charged: lay.windowBlocks per
// live sequence at most (engine.Info.BlocksFor), which bounds what the
// group holds even while a step runs.
type kvPool struct {
	kv      []arr
	lay     *kvLayout
	vOff    int32   // first value row: rows*kvHeads
	scratch int32   // the row sliding groups write the positions they do not keep to; -1 without
	free    []int32 // rows nobody holds, taken from the end
	refs    []int32 // holders of each row: sequences and saved prefixes
	live    []int32 // holders of each row that are sequences, not saved prefixes
	held    int     // full groups' rows with a live holder
	charged int     // sliding groups' rows charged to live sequences
}

// seqRows is a sequence's rows in one group: rows[i] holds position
// from+i (a sliding group's positions before from were given back; while
// a step runs, the positions it does not keep are the scratch row).
type seqRows struct {
	from int
	rows []int32
}

// at is the row of position i.
func (r *seqRows) at(i int) int32 { return r.rows[i-r.from] }

// span is the rows of positions [lo, hi).
func (r *seqRows) span(lo, hi int) []int32 { return r.rows[lo-r.from : hi-r.from] }

// newPool allocates and zeroes the pool of blocks rows for layout lay.
// MLX thread only.
func newPool(g *graph, c *modelConfig, lay *kvLayout, dt C.mlx_dtype, blocks int) *kvPool {
	rows, scratch := blocks, int32(-1)
	if lay.sliding > 0 {
		rows, scratch = blocks+1, int32(blocks)
	}
	p := &kvPool{kv: make([]arr, lay.slots()), lay: lay, vOff: int32(rows * c.KVHeads), scratch: scratch,
		free: make([]int32, blocks), refs: make([]int32, blocks), live: make([]int32, blocks)}
	for i := range p.free {
		p.free[i] = int32(blocks - 1 - i) // row 0 first
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
// by saved prefixes, less what live sequences are charged in sliding
// groups (engine.BlockPool.FreeBlocks).
func (p *kvPool) available() int { return len(p.refs) - p.held - p.charged }

// charge is what a live sequence of n positions is charged in the
// sliding groups.
func (p *kvPool) charge(n int) int { return p.lay.sliding * min(n, p.lay.windowBlocks()) }

// newRows is the rows a step of t tokens takes from the free list.
func (p *kvPool) newRows(t int) int {
	n := 0
	for gi := range p.lay.groups {
		n += p.lay.keeps(gi, t)
	}
	return n
}

// end is the positions s holds rows for.
func (s *seqState) end() int {
	if len(s.kv) == 0 {
		return 0
	}
	return s.kv[0].from + len(s.kv[0].rows)
}

// take gives the live sequence s rows for t more positions: in every
// full group t rows, in a sliding group those of the last lay.keep
// positions (the others are the scratch row). It reports false, and
// takes nothing, when fewer are free.
func (p *kvPool) take(s *seqState, t int) bool {
	if len(p.free) < p.newRows(t) {
		return false
	}
	if s.kv == nil {
		s.kv, s.pool = make([]seqRows, len(p.lay.groups)), p
	}
	at := s.end()
	for gi := range s.kv {
		k := p.lay.keeps(gi, t)
		for range t - k {
			s.kv[gi].rows = append(s.kv[gi].rows, p.scratch)
		}
		got := p.free[len(p.free)-k:]
		for _, r := range got {
			p.refs[r], p.live[r] = 1, 1
		}
		if !p.lay.slides[gi] {
			p.held += k
		}
		s.kv[gi].rows = append(s.kv[gi].rows, got...)
		p.free = p.free[:len(p.free)-k]
	}
	p.charged += p.charge(at+t) - p.charge(at)
	return true
}

// settle gives back the rows of the live sequence s that its sliding
// groups no longer keep, once a step has run.
func (p *kvPool) settle(s *seqState) {
	end := s.end()
	for gi := range s.kv {
		if !p.lay.slides[gi] {
			continue
		}
		r := &s.kv[gi]
		cut := max(0, end-p.lay.keep-r.from)
		for _, row := range r.rows[:cut] {
			p.leave(row, false)
		}
		r.rows, r.from = r.rows[cut:], r.from+cut
	}
}

// share gives the new live sequence s the first n positions of from:
// every row of a full group, a sliding group's last lay.keep of them.
// Rows only saved prefixes held until now stop counting as free. n must
// leave the window of position n in from's rows (canShare).
func (p *kvPool) share(s *seqState, from *seqState, n int) {
	s.kv, s.pool = make([]seqRows, len(from.kv)), p
	for gi, fr := range from.kv {
		lo := 0
		if p.lay.slides[gi] {
			lo = max(fr.from, n-p.lay.keep)
		}
		rows := fr.span(lo, n)
		for _, r := range rows {
			p.refs[r]++
			if p.live[r]++; p.live[r] == 1 && !p.lay.slides[gi] {
				p.held++
			}
		}
		s.kv[gi] = seqRows{from: lo, rows: slices.Clone(rows)}
	}
	p.charged += p.charge(n)
}

// canShare reports whether the saved sequence from still holds what a
// sequence reusing its first n positions reads: in every sliding group,
// the window of position n.
func (p *kvPool) canShare(from *seqState, n int) bool {
	for gi, fr := range from.kv {
		if p.lay.slides[gi] && fr.from > max(0, n-p.lay.window+1) {
			return false
		}
	}
	return true
}

// drop releases the live sequence s's rows from position n on.
func (p *kvPool) drop(s *seqState, n int) {
	end := s.end()
	for gi := range s.kv {
		r := &s.kv[gi]
		cut := max(0, n-r.from)
		for _, row := range r.rows[cut:] {
			p.leave(row, !p.lay.slides[gi])
		}
		r.rows = r.rows[:cut]
	}
	p.charged -= p.charge(end) - p.charge(n)
}

// leave drops a live sequence's hold on row r; counted tells whether r
// is a full group's row, which held counts.
func (p *kvPool) leave(r int32, counted bool) {
	if r == p.scratch {
		return
	}
	if p.live[r]--; p.live[r] == 0 && counted {
		p.held--
	}
	p.unref(r)
}

// park turns the live sequence s into a saved prefix: its rows stay in
// the pool, and those no live sequence shares count as free.
func (p *kvPool) park(s *seqState) {
	for gi, r := range s.kv {
		for _, row := range r.rows {
			if p.live[row]--; p.live[row] == 0 && !p.lay.slides[gi] {
				p.held--
			}
		}
	}
	p.charged -= p.charge(s.end())
}

// dropSaved releases the rows of s, a saved prefix (park).
func (p *kvPool) dropSaved(s *seqState) {
	for _, r := range s.kv {
		for _, row := range r.rows {
			p.unref(row)
		}
	}
	s.kv = nil
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
// step that needs more blocks than FreeBlocks fails with
// engine.ErrOutOfMemory before anything is taken or evicted. Scratch
// sequences (Warm's, not open in m.seqs) take only free rows and evict
// nothing. MLX thread only.
func (m *model) rowsFor(feeds []feed) error {
	need, rows, scratch := 0, 0, false
	for _, f := range feeds {
		at := len(f.seq.tokens)
		need += m.info.BlocksFor(at+len(f.tokens)) - m.info.BlocksFor(at)
		rows += m.pool.newRows(len(f.tokens))
		scratch = scratch || m.seqs[f.id] != f.seq
	}
	have := m.pool.available()
	if scratch {
		have, need = len(m.pool.free), rows
	}
	if need > have {
		return fmt.Errorf("mlx: %s: KV cache has %d free blocks, the step needs %d: %w",
			m.info.ID, have, need, engine.ErrOutOfMemory)
	}
	for len(m.pool.free) < rows && len(m.saved) > 0 {
		m.evictOldest() // saved prefixes hold the missing rows
	}
	for i, f := range feeds {
		if !m.pool.take(f.seq, len(f.tokens)) { // only if the counts were wrong
			for _, g := range feeds[:i] {
				m.pool.drop(g.seq, len(g.seq.tokens))
			}
			return fmt.Errorf("mlx: %s: KV cache has %d free rows after evicting every saved prefix, the step needs %d: %w",
				m.info.ID, len(m.pool.free), rows, engine.ErrOutOfMemory)
		}
	}
	return nil
}

// kvOf is the pool array layer li reads and writes.
func (m *model) kvOf(li int) *arr { return &m.pool.kv[m.pool.lay.slot[li]] }

// writeKV stores the step's keys and values, upd [2*N*kvHeads, 1,
// headDim] (every token's key heads, then every token's value heads),
// into layer li's pool at rows idx (kvRows of its group). The pool's old
// handle is dropped before evaluation, so MLX updates it in place (the
// layers of other groups that share the array read it before, in the
// order of the layers).
func (m *model) writeKV(g *graph, li int, idx, upd arr) {
	kv := m.kvOf(li)
	m.replace(g, kv, g.scatterRows(*kv, idx, upd))
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
	kv := *m.kvOf(li)
	return g.take(kv, idx.k, 0), g.take(kv, idx.v, 0)
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

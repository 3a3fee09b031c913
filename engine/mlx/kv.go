//go:build mlx

package mlx

/*
#include "mlx/c/mlx.h"
*/
import "C"

import (
	"fmt"
	"math"
	"slices"

	"github.com/mlxserving/mlxserving/engine"
)

// kvPool is a model's KV cache: one array per layer, [2*rows*kvHeads,
// headDim] in the weights' dtype, keys first (row r's head h at
// r*kvHeads+h) and values after them (at vOff+r*kvHeads+h), allocated
// once at load with the rows of the layer's group (kvLayout) and, in
// the sliding group, one scratch row more. A sequence holds a row per
// position in each group (seqState.kv), taken as it is fed; a step
// writes its new tokens' keys and values with one scatter per layer and
// attention gathers each sequence's rows, so the cache never grows or
// concatenates. Rows are reference-counted: a saved prefix and the
// sequences that reuse it share their rows.
//
// The pool is the model's engine.BlockPool with blocks of one row
// (Info.BlockSize 1): a row is held while a live sequence references it;
// rows referenced only by saved prefixes count as free and go back to the
// free list when their last saved prefix is evicted. The sliding group
// keeps a sequence's last lay.keep positions after each step (settle)
// and, before a step takes rows, gives back those it will neither read
// nor keep (trim); its rows are not counted one by one but charged,
// lay.windowBlocks per live sequence at most, which bounds what it holds
// even while a step runs.
type kvPool struct {
	kv      []arr
	lay     *kvLayout
	groups  []rowPool // per group of lay
	charged int       // the sliding group's rows charged to live sequences
}

// rowPool is one group's rows.
type rowPool struct {
	vOff    int32   // first value row: rows*kvHeads
	scratch int32   // the row the sliding group writes the positions it does not keep to; -1 in a full group
	free    []int32 // rows nobody holds, taken from the end
	refs    []int32 // holders of each row: sequences and saved prefixes
	live    []int32 // holders of each row that are sequences, not saved prefixes
	held    int     // rows with a live holder
}

// seqRows is a sequence's rows in one group: rows[i] holds position
// from+i (the sliding group's positions before from were given back;
// while a step runs, the positions it does not keep are the scratch row).
type seqRows struct {
	from int
	rows []int32
}

// span is the rows of positions [lo, hi).
func (r *seqRows) span(lo, hi int) []int32 { return r.rows[lo-r.from : hi-r.from] }

// newPool allocates and zeroes the pool, rows[gi] rows for group gi of
// lay. MLX thread only.
func newPool(g *graph, c *modelConfig, lay *kvLayout, dt C.mlx_dtype, rows []int) *kvPool {
	p := &kvPool{kv: make([]arr, c.Layers), lay: lay, groups: make([]rowPool, len(rows))}
	for gi, n := range rows {
		rp := rowPool{scratch: -1, free: make([]int32, n), refs: make([]int32, n), live: make([]int32, n)}
		for i := range rp.free {
			rp.free[i] = int32(n - 1 - i) // row 0 first
		}
		if lay.slides[gi] {
			rp.scratch, n = int32(n), n+1
		}
		rp.vOff = int32(n * c.KVHeads)
		for _, li := range lay.groups[gi] {
			p.kv[li] = g.keep(g.zeros(dt, 2*n*c.KVHeads, c.HeadDim))
		}
		p.groups[gi] = rp
	}
	g.eval(p.kv...)
	return p
}

func (p *kvPool) release() {
	for l := range p.kv {
		free(&p.kv[l])
	}
}

// available is the blocks sequences can take (engine.BlockPool.FreeBlocks):
// the first group's free rows and those held only by saved prefixes,
// less, when it slides, what live sequences are charged. A sliding group
// after a full one is sized for the batch (kvLayout.rows) and not
// counted here.
func (p *kvPool) available() int {
	rp := &p.groups[0]
	if p.lay.slides[0] {
		return len(rp.refs) - p.charged
	}
	return len(rp.refs) - rp.held
}

// freeRows is the rows a step can take without evicting: the fewest
// free in a group.
func (p *kvPool) freeRows() int {
	n := math.MaxInt
	for gi := range p.groups {
		n = min(n, len(p.groups[gi].free))
	}
	return n
}

// takes is the rows each group gives a step of feeds.
func (p *kvPool) takes(feeds []feed) []int {
	n := make([]int, len(p.groups))
	for gi := range n {
		for _, f := range feeds {
			n[gi] += p.lay.keeps(gi, len(f.tokens))
		}
	}
	return n
}

// fits reports whether every group has the free rows a step of feeds
// takes once the feeds gave back their stale rows (trim); with saved,
// counting the rows only saved prefixes hold too (those evicting them
// frees).
func (p *kvPool) fits(feeds []feed, saved bool) bool {
	for gi, n := range p.takes(feeds) {
		rp := &p.groups[gi]
		room := len(rp.free)
		if saved {
			room = len(rp.refs) - rp.held
		}
		if n > room+p.trims(feeds, gi, saved) {
			return false
		}
	}
	return true
}

// trims is how many rows of group gi trimming the feeds' sequences
// would free (no saved prefix nor other live sequence holds them) or,
// with saved, leave to saved prefixes alone. Counted before trimming, so
// a step refused for want of rows changes nothing.
func (p *kvPool) trims(feeds []feed, gi int, saved bool) int {
	if !p.lay.slides[gi] {
		return 0
	}
	cuts := map[int32]int32{} // row: the feeds that give it back
	for _, f := range feeds {
		if f.seq.kv == nil {
			continue
		}
		r := &f.seq.kv[gi]
		for _, row := range r.rows[:max(0, p.stale(f.seq, len(f.tokens))-r.from)] {
			cuts[row]++
		}
	}
	holders := p.groups[gi].refs
	if saved {
		holders = p.groups[gi].live
	}
	n := 0
	for row, c := range cuts {
		if holders[row] == c {
			n++
		}
	}
	return n
}

// charge is what a live sequence of n positions is charged in the
// sliding group.
func (p *kvPool) charge(n int) int {
	if !p.lay.sliding() {
		return 0
	}
	return min(n, p.lay.windowBlocks())
}

// end is the positions s holds rows for.
func (s *seqState) end() int {
	if len(s.kv) == 0 {
		return 0
	}
	return s.kv[0].from + len(s.kv[0].rows)
}

// take gives the live sequence s rows for t more positions: in a full
// group t rows, in the sliding group those of the last lay.keep
// positions (the others are the scratch row). The caller checked they
// are free (fits).
func (p *kvPool) take(s *seqState, t int) {
	if s.kv == nil {
		s.kv, s.pool = make([]seqRows, len(p.groups)), p
	}
	at := s.end()
	for gi := range s.kv {
		rp, k := &p.groups[gi], p.lay.keeps(gi, t)
		for range t - k {
			s.kv[gi].rows = append(s.kv[gi].rows, rp.scratch)
		}
		got := rp.free[len(rp.free)-k:]
		for _, r := range got {
			rp.refs[r], rp.live[r] = 1, 1
		}
		rp.held += k
		s.kv[gi].rows = append(s.kv[gi].rows, got...)
		rp.free = rp.free[:len(rp.free)-k]
	}
	p.charged += p.charge(at+t) - p.charge(at)
}

// stale is where the sliding rows a step of t tokens of the live
// sequence s reads or keeps begin: its first query reads the window-1
// positions before it, and the group keeps the last lay.keep after it.
func (p *kvPool) stale(s *seqState, t int) int {
	at := s.end()
	return min(at-p.lay.window+1, at+t-p.lay.keep)
}

// trim gives back the rows of the live sequence s that a step of t
// tokens neither reads nor keeps, before it takes its own.
func (p *kvPool) trim(s *seqState, t int) { p.cut(s, p.stale(s, t)) }

// settle gives back the rows of the live sequence s that the sliding
// group no longer keeps, once a step has run.
func (p *kvPool) settle(s *seqState) { p.cut(s, s.end()-p.lay.keep) }

// cut gives back the sliding group's rows of the live sequence s before
// position pos.
func (p *kvPool) cut(s *seqState, pos int) {
	for gi := range s.kv {
		if !p.lay.slides[gi] {
			continue
		}
		r := &s.kv[gi]
		n := max(0, pos-r.from)
		for _, row := range r.rows[:n] {
			p.groups[gi].leave(row)
		}
		r.rows, r.from = r.rows[n:], r.from+n
	}
}

// share gives the new live sequence s the first n positions of from:
// every row of a full group, the sliding group's last lay.keep of them.
// Rows only saved prefixes held until now stop counting as free. The
// sliding group must hold the window of position n (canShare).
func (p *kvPool) share(s *seqState, from *seqState, n int) {
	s.kv, s.pool = make([]seqRows, len(from.kv)), p
	for gi, fr := range from.kv {
		lo := 0
		if p.lay.slides[gi] {
			lo = max(fr.from, n-p.lay.keep)
		}
		rows, rp := fr.span(lo, n), &p.groups[gi]
		for _, r := range rows {
			rp.refs[r]++
			if rp.live[r]++; rp.live[r] == 1 {
				rp.held++
			}
		}
		s.kv[gi] = seqRows{from: lo, rows: slices.Clone(rows)}
	}
	p.charged += p.charge(n)
}

// canShare reports whether the saved sequence from still holds what a
// sequence reusing its first n positions reads: in the sliding group,
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
			p.groups[gi].leave(row)
		}
		r.rows = r.rows[:cut]
	}
	p.charged -= p.charge(end) - p.charge(n)
}

// leave drops a live sequence's hold on row r.
func (rp *rowPool) leave(r int32) {
	if r == rp.scratch {
		return
	}
	if rp.live[r]--; rp.live[r] == 0 {
		rp.held--
	}
	rp.unref(r)
}

// park turns the live sequence s into a saved prefix: its rows stay in
// the pool, and those no live sequence shares count as free.
func (p *kvPool) park(s *seqState) {
	for gi, r := range s.kv {
		rp := &p.groups[gi]
		for _, row := range r.rows {
			if rp.live[row]--; rp.live[row] == 0 {
				rp.held--
			}
		}
	}
	p.charged -= p.charge(s.end())
}

// dropSaved releases the rows of s, a saved prefix (park).
func (p *kvPool) dropSaved(s *seqState) {
	for gi, r := range s.kv {
		for _, row := range r.rows {
			p.groups[gi].unref(row)
		}
	}
	s.kv = nil
}

// unref drops one holder of row r, freeing it with the last.
func (rp *rowPool) unref(r int32) {
	if rp.refs[r]--; rp.refs[r] == 0 {
		rp.free = append(rp.free, r)
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

// rowsFor gives every feed rows for its new tokens, after its sliding
// rows the step neither reads nor keeps went back (trim), evicting saved
// prefixes (least recently used first) when too few rows are free. A
// step that needs more blocks than FreeBlocks, or more rows of the
// sliding group than live sequences leave, fails with
// engine.ErrOutOfMemory before anything is taken or evicted. Scratch
// sequences (Warm's, not open in m.seqs) take only free rows and evict
// nothing. MLX thread only.
func (m *model) rowsFor(feeds []feed) error {
	need, scratch := 0, false
	for _, f := range feeds {
		at := len(f.seq.tokens)
		need += m.info.BlocksFor(at+len(f.tokens)) - m.info.BlocksFor(at)
		scratch = scratch || m.seqs[f.id] != f.seq
	}
	if have := m.pool.available(); need > have || !m.pool.fits(feeds, !scratch) {
		return fmt.Errorf("mlx: %s: KV cache has %d free blocks, the step needs %d: %w",
			m.info.ID, have, need, engine.ErrOutOfMemory)
	}
	for _, f := range feeds {
		m.pool.trim(f.seq, len(f.tokens))
	}
	for !m.pool.fits(feeds, false) && len(m.saved) > 0 {
		m.evictOldest() // saved prefixes hold the missing rows
	}
	for _, f := range feeds {
		m.pool.take(f.seq, len(f.tokens))
	}
	return nil
}

// kvOf is the pool array layer li reads and writes.
func (m *model) kvOf(li int) *arr { return &m.pool.kv[li] }

// writeKV stores the step's keys and values, upd [2*N*kvHeads, 1,
// headDim] (every token's key heads, then every token's value heads),
// into layer li's pool at rows idx (kvRows of its group). The pool's old
// handle is dropped before evaluation, so MLX updates it in place.
func (m *model) writeKV(g *graph, li int, idx, upd arr) {
	kv := m.kvOf(li)
	m.replace(g, kv, g.scatterRows(*kv, idx, upd))
}

// kvRows is the pool rows [2*N*kvHeads] that a step writes for tokens
// at token rows of group gi: each token's key heads, then each token's value heads,
// in writeKV's order. Built on the host once per step.
func (m *model) kvRows(g *graph, gi int, rows []int32) arr {
	h, n, vOff := int32(m.cfg.KVHeads), len(rows), m.pool.groups[gi].vOff
	out := make([]int32, 2*n*int(h))
	for i, r := range rows {
		for j := range h {
			at := i*int(h) + int(j)
			out[at] = r*h + j
			out[n*int(h)+at] = vOff + r*h + j
		}
	}
	return g.int32s(out, len(out))
}

// headRows turns token rows [B*T] (T per sequence) of group gi into the pool's head
// rows [B, kvHeads, T] of keys and of values, so that one take each
// gathers them already in attention's [B, kvHeads, T, D] layout,
// contiguous: MLX's fused decode kernel then reads them without a copy.
// Built on the host once per step and shared by every layer.
func (m *model) headRows(g *graph, gi int, rows []int32, b, t int) kvIdx {
	h, vOff := m.cfg.KVHeads, m.pool.groups[gi].vOff
	k, v := make([]int32, b*h*t), make([]int32, b*h*t)
	for i := range b {
		for j := range h {
			for x := range t {
				r := rows[i*t+x]*int32(h) + int32(j)
				k[(i*h+j)*t+x], v[(i*h+j)*t+x] = r, r+vOff
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

//go:build mlx

package mlx

/*
#include "mlx/c/mlx.h"
*/
import "C"

import (
	"math"

	"github.com/mlxserving/mlxserving/engine"
)

// kvStep is how much a sequence's KV cache grows at a time, in tokens.
const kvStep = 256

// seqState is one open sequence: the tokens fed so far and its KV cache,
// one key and one value array per layer, shaped [1, kvHeads, cap, headDim]
// with the first len(tokens) positions valid.
type seqState struct {
	tokens   []int32
	k, v     []arr
	cap      int
	key      arr // sampling PRNG key, made at the first sample
	reserved int // KV tokens reserved at Open
	// sampled is set at the first sample; tokens fed after it are
	// generated and counts holds them for presence/frequency penalties.
	sampled bool
	counts  map[int32]int
}

func (s *seqState) free() {
	for i := range s.k {
		free(&s.k[i])
		free(&s.v[i])
	}
	free(&s.key)
}

// feed is one sequence's part of a forward pass.
type feed struct {
	id      engine.SeqID
	seq     *seqState
	tokens  []int32
	sample  bool
	allowed []uint64 // the step's allowed-token mask; nil: all
}

// forward runs the model over every feed's tokens in one pass: the
// projections and MLP see all tokens packed together; attention runs per
// sequence against its own cache. It replaces each sequence's cache handles
// with the updated ones (computed when the caller evaluates) and returns
// float32 logits [S, vocab] for the feeds that sample, in order, or a null
// array when none samples.
func (m *model) forward(g *graph, feeds []feed, sampling bool) arr {
	c, w := m.cfg, m.w
	var ids, pos, last []int32
	for _, f := range feeds {
		for j := range f.tokens {
			pos = append(pos, int32(len(f.seq.tokens)+j))
		}
		ids = append(ids, f.tokens...)
		if f.sample {
			last = append(last, int32(len(ids)-1))
		}
		m.grow(g, f.seq, len(f.seq.tokens)+len(f.tokens))
	}
	positions := g.int32s(pos, len(pos))
	x := g.reshape(w.embed.rows(g, g.int32s(ids, len(ids))), 1, len(ids), c.Hidden)
	for li := range w.layers {
		x = m.block(g, li, x, feeds, positions, len(ids))
	}
	if !sampling {
		return arr{}
	}
	x = g.take(x, g.int32s(last, len(last)), 1)
	x = g.rmsNorm(x, w.norm, c.NormEps)
	head := &w.head
	if c.Tied {
		head = &w.embed
	}
	logits := head.apply(g, x)
	return g.astype(g.reshape(logits, len(last), c.Vocab), C.MLX_FLOAT32)
}

// block is one decoder layer. Projections, RoPE and the MLP run over all
// packed tokens at once; each token is its own RoPE batch row at its own
// position, so sequences at different offsets rotate in one op.
func (m *model) block(g *graph, li int, x arr, feeds []feed, positions arr, n int) arr {
	c, l := m.cfg, &m.w.layers[li]
	h := g.rmsNorm(x, l.inNorm, c.NormEps)
	tokens := func(a arr, heads int) arr { // [1, N, heads*D] -> [N, heads, 1, D]
		return g.transpose(g.reshape(a, n, 1, heads, c.HeadDim), 0, 2, 1, 3)
	}
	q, k, v := l.q.apply(g, h), l.k.apply(g, h), l.v.apply(g, h)
	if c.QKNorm {
		q = g.reshape(g.rmsNorm(g.reshape(q, 1, n, c.Heads, c.HeadDim), l.qNorm, c.NormEps), 1, n, c.Heads*c.HeadDim)
		k = g.reshape(g.rmsNorm(g.reshape(k, 1, n, c.KVHeads, c.HeadDim), l.kNorm, c.NormEps), 1, n, c.KVHeads*c.HeadDim)
	}
	scale := float32(1)
	if c.Rope.Type == "linear" {
		scale = float32(1 / c.Rope.Factor)
	}
	q = g.ropeAt(tokens(q, c.Heads), c.HeadDim, c.RopeTheta, scale, positions, m.w.freqs)
	k = g.ropeAt(tokens(k, c.KVHeads), c.HeadDim, c.RopeTheta, scale, positions, m.w.freqs)
	v = tokens(v, c.KVHeads)
	outs := make([]arr, len(feeds))
	row := 0
	for i, f := range feeds {
		outs[i] = m.attend(g, li, f, row, q, k, v)
		row += len(f.tokens)
	}
	x = g.add(x, l.o.apply(g, g.concat(1, outs...)))
	h = g.rmsNorm(x, l.postNorm, c.NormEps)
	gate := l.gate.apply(g, h)
	act := g.mul(g.mul(gate, g.sigmoid(gate)), l.up.apply(g, h))
	return g.add(x, l.down.apply(g, act))
}

// attend is one sequence's attention in layer li over rows
// [row, row+len(f.tokens)) of the rotated q, k, v ([N, heads, 1, D]).
func (m *model) attend(g *graph, li int, f feed, row int, q, k, v arr) arr {
	c, s := m.cfg, f.seq
	t, off, d := len(f.tokens), len(s.tokens), c.HeadDim
	heads := func(a arr, n int) arr { // rows -> [1, n, t, D]
		a = g.slice(a, []int{row, 0, 0, 0}, []int{row + t, n, 1, d})
		if t == 1 {
			return a
		}
		return g.reshape(g.transpose(a, 2, 1, 0, 3), 1, n, t, d)
	}
	qs, ks, vs := heads(q, c.Heads), heads(k, c.KVHeads), heads(v, c.KVHeads)
	start, stop := []int{0, 0, off, 0}, []int{1, c.KVHeads, off + t, d}
	kc, vc := g.sliceUpdate(s.k[li], ks, start, stop), g.sliceUpdate(s.v[li], vs, start, stop)
	m.replace(g, &s.k[li], kc)
	m.replace(g, &s.v[li], vc)
	all := []int{1, c.KVHeads, off + t, d}
	kv, vv := g.slice(kc, []int{0, 0, 0, 0}, all), g.slice(vc, []int{0, 0, 0, 0}, all)
	o := g.sdpa(qs, kv, vv, float32(1/math.Sqrt(float64(d))), t > 1)
	if t == 1 {
		return g.reshape(o, 1, 1, c.Heads*d)
	}
	return g.reshape(g.transpose(o, 0, 2, 1, 3), 1, t, c.Heads*d)
}

// replace swaps a kept handle for a new one. The old buffer is then held
// only by the graph, so MLX can update the cache in place.
func (m *model) replace(g *graph, h *arr, a arr) {
	free(h)
	*h = g.keep(a)
}

// grow makes room for n tokens in s's cache.
func (m *model) grow(g *graph, s *seqState, n int) {
	if n <= s.cap {
		return
	}
	c := m.cfg
	newCap := (n + kvStep - 1) / kvStep * kvStep
	if newCap > m.info.ContextLength {
		newCap = n
	}
	if s.k == nil {
		s.k, s.v = make([]arr, c.Layers), make([]arr, c.Layers)
	}
	off := len(s.tokens)
	for li := range s.k {
		for _, h := range []*arr{&s.k[li], &s.v[li]} {
			if isNull(*h) || off == 0 {
				m.replace(g, h, g.zeros(m.w.dtype, 1, c.KVHeads, newCap, c.HeadDim))
				continue
			}
			old := g.slice(*h, []int{0, 0, 0, 0}, []int{1, c.KVHeads, off, c.HeadDim})
			pad := g.zeros(m.w.dtype, 1, c.KVHeads, newCap-off, c.HeadDim)
			m.replace(g, h, g.concat(2, old, pad))
		}
	}
	s.cap = newCap
}

//go:build mlx

package mlx

/*
#include "mlx/c/mlx.h"
*/
import "C"

import (
	"math"
	"slices"
)

// attendDecode is the decode feeds' attention in layer li, one call for
// all of them: queries [B, heads, 1, D] against each sequence's rows
// (sliding layers: the last Window of them), as they are when every feed
// attends as many rows (MLX's CUDA backend then takes its fused decode
// kernel), else padded and masked; on a CUDA GPU the pool kernel reads
// the rows in place instead (attendPooled). It returns [B, heads*D].
func (m *model) attendDecode(g *graph, li int, p *stepPlan, q arr) arr {
	c, b := m.cfg, len(p.dec)
	if !isNull(p.decQ) {
		q = g.take(q, p.decQ, 0)
	}
	if p.pooled {
		return m.attendPooled(g, li, p, q, false)
	}
	gd := &p.decs[m.pool.lay.group[li]]
	d := gd.all
	if gd.win != nil && c.slides(li) {
		d = gd.win
	}
	k, v := m.gather(g, li, d.idx)
	return g.reshape(m.attnCore(g, li, q, k, v, d.msk, false), b, c.Heads*c.HeadDim)
}

// attend is the causal attention in layer li of a group of prefill
// feeds, one call for the group: their rows of the rotated q, k and v
// ([N, heads or kvHeads, 1, D]; a single feed's start at packed token
// row) against their pool rows (this step's included) or, on sliding
// layers, against the pool rows inside the first query's window that
// came before this step and this step's keys and values as computed,
// band-masked. It returns [G*t, heads*D], feed by feed.
func (m *model) attend(g *graph, li int, grp *preGroup, row int, q, k, v arr) arr {
	c := m.cfg
	b, t := len(grp.feeds), grp.t
	qs := m.groupRows(g, grp, row, q, c.Heads)
	var o arr
	if c.slides(li) {
		k, v := m.windowKV(g, li, grp, m.groupRows(g, grp, row, k, c.KVHeads), m.groupRows(g, grp, row, v, c.KVHeads))
		if isNull(grp.band) {
			o = m.attnCore(g, li, qs, k, v, grp.mask, true)
		} else {
			o = m.attnCore(g, li, qs, k, v, grp.band, false)
		}
	} else {
		k, v := m.gather(g, li, grp.idx[m.pool.lay.group[li]])
		o = m.attnCore(g, li, qs, k, v, grp.mask, true)
	}
	return g.reshape(g.transpose(o, 0, 2, 1, 3), b*t, c.Heads*c.HeadDim)
}

// groupRows is a prefill group's rows of x [N, heads, 1, D] as [G,
// heads, t, D].
func (m *model) groupRows(g *graph, grp *preGroup, row int, x arr, heads int) arr {
	b, t, d := len(grp.feeds), grp.t, m.cfg.HeadDim
	if isNull(grp.q) {
		x = g.slice(x, []int{row, 0, 0, 0}, []int{row + t, heads, 1, d})
	} else {
		x = g.take(x, grp.q, 0)
	}
	return g.transpose(g.reshape(x, b, t, heads, d), 0, 2, 1, 3)
}

// windowKV is the keys and values a sliding layer li attends in a
// prefill group: the pool rows before the step that the first query's
// window reads, then the step's own k and v [G, kvHeads, t, D], in the
// pool's dtype as a gather would give them.
func (m *model) windowKV(g *graph, li int, grp *preGroup, k, v arr) (arr, arr) {
	if dt := dtype(*m.kvOf(li)); dtype(k) != dt {
		k, v = g.astype(k, dt), g.astype(v, dt)
	}
	old := grp.old[m.pool.lay.group[li]]
	if isNull(old.k) {
		return k, v
	}
	ko, vo := m.gather(g, li, old)
	return g.concat(2, ko, k), g.concat(2, vo, v)
}

// attnScale is the queries' scale: query_pre_attn_scalar**-0.5 (Gemma)
// or 1/sqrt(head_dim).
func (c *modelConfig) attnScale() float32 {
	if c.AttnScale != 0 {
		return c.AttnScale
	}
	return float32(1 / math.Sqrt(float64(c.HeadDim)))
}

// attnCore is layer li's attention of q [B, heads, Tq, D] over k, v [B,
// kvHeads, Tk, D] with mask (boolean, true: attend; or additive) or,
// when mask is null, causal or none: MLX's fused scaled-dot-product
// attention, with the layer's sinks (gpt-oss) when it has them, or with
// soft-capped logits (Gemma 2) the same written out.
func (m *model) attnCore(g *graph, li int, q, k, v, mask arr, causal bool) arr {
	c, sinks := m.cfg, m.w.layers[li].sinks
	if c.AttnCap != 0 {
		return m.softcapAttention(g, q, k, v, mask)
	}
	if isNull(mask) {
		return g.sdpa(q, k, v, c.attnScale(), causal, sinks)
	}
	return g.sdpaMask(q, k, v, c.attnScale(), mask, sinks)
}

// softcapAttention is Gemma 2's eager attention: scores q·k * scale,
// tanh(s/cap)*cap, masked, softmax, times v; key/value heads are shared
// by heads/kvHeads query heads each. mask is never null here: prefill
// groups carry their causal mask when the model soft-caps.
func (m *model) softcapAttention(g *graph, q, k, v, mask arr) arr {
	c := m.cfg
	qs, ks := shapeOf(q), shapeOf(k)
	b, tq, tk, d := qs[0], qs[2], ks[2], c.HeadDim
	rep := c.Heads / c.KVHeads
	dt := m.w.dtype
	q5 := g.reshape(q, b, c.KVHeads, rep, tq, d)
	k5 := g.reshape(k, b, c.KVHeads, 1, tk, d)
	v5 := g.reshape(v, b, c.KVHeads, 1, tk, d)
	s := g.mul(g.matmul(q5, g.transpose(k5, 0, 1, 2, 4, 3)), g.scalarOf(c.attnScale(), dt))
	cp := g.scalarOf(c.AttnCap, dt)
	s = g.mul(g.tanh(g.div(s, cp)), cp)
	if !isNull(mask) {
		if dtype(mask) == C.MLX_BOOL {
			s = g.where(mask, s, g.scalarOf(float32(math.Inf(-1)), dt))
		} else { // decode's additive [B, 1, 1, Tk]
			s = g.add(s, g.reshape(mask, b, 1, 1, 1, tk))
		}
	}
	o := g.matmul(g.softmax(s, -1), v5)
	return g.reshape(o, b, c.Heads, tq, d)
}

// bandMask is [t, n] booleans: query position q0+i attends key position
// k0+j iff k0+j <= q0+i and, with a window w > 0, k0+j > q0+i-w.
func bandMask(g *graph, q0, t, k0, n, w int) arr {
	qp, kp := make([]int32, t), make([]int32, n)
	for i := range qp {
		qp[i] = int32(q0 + i)
	}
	for j := range kp {
		kp[j] = int32(k0 + j)
	}
	qa, ka := g.int32s(qp, t, 1), g.int32s(kp, 1, n)
	mask := g.greaterEqual(qa, ka)
	if w > 0 {
		lo := slices.Clone(qp)
		for i := range lo {
			lo[i] -= int32(w)
		}
		mask = g.and(mask, g.greater(ka, g.int32s(lo, t, 1)))
	}
	return mask
}

// planLongRoPE marks the step's tokens that rotate with longrope's long
// frequencies. transformers switches frequencies per forward call, on
// the longest sequence length the call reaches (position + 1) against
// original_max_position_embeddings, and keeps the keys it cached before;
// here each feed is one such call: its tokens rotate long when the
// sequence's length after the feed exceeds the original. A prompt fed
// whole and every decode token then rotate as in transformers' generate;
// a prompt that crosses the original length in chunks rotates its
// earlier chunks short.
func (m *model) planLongRoPE(g *graph, feeds []feed, p *stepPlan) {
	c := m.cfg
	if c.Rope.Type != "longrope" {
		return
	}
	long := make([]bool, 0, p.n)
	some, all := false, true
	for _, f := range feeds {
		l := len(f.seq.tokens)+len(f.tokens) > c.Rope.OriginalMax
		some, all = some || l, all && l
		for range f.tokens {
			long = append(long, l)
		}
	}
	switch {
	case all:
		p.longAll = true
	case some:
		p.longMask = g.bools(long, p.n, 1, 1, 1)
	}
}

// geluTanh is GELU with the tanh approximation (gelu_pytorch_tanh),
// computed in float32: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x³))).
func geluTanh(g *graph, x arr) arr {
	dt := dtype(x)
	f := x
	if dt != C.MLX_FLOAT32 {
		f = g.astype(x, C.MLX_FLOAT32)
	}
	x3 := g.mul(g.mul(f, f), f)
	inner := g.mul(g.scalar(float32(math.Sqrt(2/math.Pi))), g.add(f, g.mul(g.scalar(0.044715), x3)))
	y := g.mul(g.mul(g.scalar(0.5), f), g.add(g.scalar(1), g.tanh(inner)))
	if dt != C.MLX_FLOAT32 {
		y = g.astype(y, dt)
	}
	return y
}

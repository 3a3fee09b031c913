//go:build mlx

package mlx

/*
#include "mlx/c/mlx.h"
*/
import "C"

import (
	"github.com/mlxserving/mlxserving/engine"
)

// seqState is one open sequence: the tokens fed so far and, per layer
// group of the KV pool, the pool row of each position it holds.
type seqState struct {
	tokens []int32
	kv     []seqRows // per group (kvLayout); nil before the first row
	pool   *kvPool   // the pool rows come from; nil before the first
	// seed keys the sequence's draws (set at its first draw); drawn is
	// how many tokens it has generated (sampled, or forced after a sampled
	// one), the position of its next draw.
	seed   uint64
	seeded bool
	drawn  int
	// sampled is set at the first sample; tokens fed after it are
	// generated and counts holds them for presence/frequency penalties.
	sampled bool
	counts  map[int32]int
	// embed is set on an embedding sequence (OpenPooled).
	embed *embedState
	// lora is the adapter the sequence runs (nil: the base model); while
	// inSlot it holds a use of adapter slot slot (adapters.slots).
	lora   *adapterEntry
	slot   int
	inSlot bool
}

// free returns the sequence's rows to the pool.
func (s *seqState) free() {
	if s.pool != nil {
		s.pool.drop(s, 0)
	}
}

// feed is one sequence's part of a forward pass.
type feed struct {
	id      engine.SeqID
	seq     *seqState
	tokens  []int32
	sample  bool     // samples a token
	ends    bool     // ends an embedding sequence's input: its vector is returned
	allowed []uint64 // the step's allowed-token mask; nil: all
}

// forward runs the model over every feed's tokens in one pass: the
// projections and MLP see all tokens packed together, every decode feed
// (one token) attends in one batched call per layer, and longer (prefill)
// feeds attend in groups of the same length and position. It writes the
// new tokens' keys and values into the pool rows rowsFor gave them, and
// returns float32 logits [S, vocab] for the feeds that sample, in order,
// or a null array when none samples.
func (m *model) forward(g *graph, feeds []feed, sampling bool) arr {
	logits, _, _ := m.forwardAll(g, feeds, sampling)
	return logits
}

// forwardAll is forward that also pools the embedding feeds' last hidden
// states (after the final norm): pooled [len(pp.who), hidden] float32
// sums of the rows planPool picks, null with pp when no feed pools.
func (m *model) forwardAll(g *graph, feeds []feed, sampling bool) (logits, pooled arr, pp *poolPlan) {
	c, w := m.cfg, m.w
	if g.err != nil {
		return arr{}, arr{}, nil
	}
	if err := m.rowsFor(feeds); err != nil {
		g.err = err
		return arr{}, arr{}, nil
	}
	var ids, pos, last []int32
	for _, f := range feeds {
		for j := range f.tokens {
			pos = append(pos, int32(len(f.seq.tokens)+j))
		}
		ids = append(ids, f.tokens...)
		if f.sample {
			last = append(last, int32(len(ids)-1))
		}
	}
	p := m.plan(g, feeds)
	pp = planPool(feeds, p.start)
	positions := g.int32s(pos, len(pos))
	var x arr
	dec := m.decodeOnly(p)
	if dec {
		x = w.embed.rows(g, g.int32s(ids, len(ids))) // plain families only: no embedding scale
		h := g.rmsNorm(x, w.layers[0].inNorm, c.NormEps)
		at := g.prims
		x = m.decodeLayers(g, x, h, positions, p) // after the final norm
		m.prims.Layers = g.prims - at
		if pp != nil {
			pooled = pp.pool(g, g.take(x, g.int32s(pp.idx, len(pp.idx)), 0), c.Hidden)
		}
		if !sampling {
			return arr{}, pooled, pp
		}
		if len(last) < len(ids) {
			x = g.take(x, g.int32s(last, len(last)), 0)
		}
	} else {
		x = g.reshape(w.embed.rows(g, g.int32s(ids, len(ids))), 1, len(ids), c.Hidden)
		if !isNull(w.embedScale) {
			x = g.mul(x, w.embedScale)
		}
		at := g.prims
		for li := range w.layers {
			x = m.block(g, li, x, feeds, positions, p)
		}
		m.prims.Layers = g.prims - at
		if pp != nil {
			rows := g.rmsNorm(g.take(x, g.int32s(pp.idx, len(pp.idx)), 1), w.norm, c.NormEps)
			pooled = pp.pool(g, rows, c.Hidden)
		}
		if !sampling {
			return arr{}, pooled, pp
		}
		x = g.rmsNorm(g.take(x, g.int32s(last, len(last)), 1), w.norm, c.NormEps)
	}
	head := &w.head
	if c.Tied {
		head = &w.embed
	}
	logits = head.apply(g, x)
	if !dec { // decodeLayers' rows are [S, hidden] already
		logits = g.reshape(logits, len(last), c.Vocab)
	}
	if c.FinalCap != 0 { // tanh(logits / cap) * cap
		cp := g.scalarOf(c.FinalCap, m.w.dtype)
		logits = g.mul(g.tanh(g.div(logits, cp)), cp)
	}
	if m.w.dtype != C.MLX_FLOAT32 {
		logits = g.astype(logits, C.MLX_FLOAT32)
	}
	return logits, pooled, pp
}

// block is one decoder layer: attention and MLP with the norms where
// the architecture puts them (arch.Block). Projections, RoPE and the MLP
// run over all packed tokens at once.
func (m *model) block(g *graph, li int, x arr, feeds []feed, positions arr, p *stepPlan) arr {
	c, l := m.cfg, &m.w.layers[li]
	h := x
	if c.Block != postNorm {
		h = g.rmsNorm(x, l.inNorm, c.NormEps)
	}
	a := m.attention(g, li, h, positions, p)
	if c.Block != preNorm {
		a = g.rmsNorm(a, l.postNorm, c.NormEps)
	}
	x = g.add(x, a)
	switch c.Block {
	case preNorm:
		h = g.rmsNorm(x, l.postNorm, c.NormEps)
	case sandwich:
		h = g.rmsNorm(x, l.preFF, c.NormEps)
	default:
		h = x
	}
	f := m.mlp(g, li, h, p)
	if c.Block != preNorm {
		f = g.rmsNorm(f, l.postFF, c.NormEps)
	}
	return g.add(x, f)
}

// attention is layer li's attention over h [1, N, hidden], through the
// output projection. Each token is its own RoPE batch row at its own
// position, so sequences at different offsets rotate in one op.
func (m *model) attention(g *graph, li int, h, positions arr, p *stepPlan) arr {
	c, l, n := m.cfg, &m.w.layers[li], p.n
	tokens := func(a arr, heads int) arr { // [1, N, heads*D] -> [N, heads, 1, D]
		return g.transpose(g.reshape(a, n, 1, heads, c.HeadDim), 0, 2, 1, 3)
	}
	var q, k, v arr
	if qd, kd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim; !isNull(l.qkv.w) {
		y := m.proj(g, li, pQKV, &l.qkv, h, p)
		q = g.slice(y, []int{0, 0, 0}, []int{1, n, qd})
		k = g.slice(y, []int{0, 0, qd}, []int{1, n, qd + kd})
		v = g.slice(y, []int{0, 0, qd + kd}, []int{1, n, qd + 2*kd})
	} else {
		q, k, v = m.proj(g, li, pQ, &l.q, h, p), m.proj(g, li, pK, &l.k, h, p), m.proj(g, li, pV, &l.v, h, p)
	}
	switch {
	case c.QKNorm && c.QKNormWhole:
		q, k = g.rmsNorm(q, l.qNorm, c.NormEps), g.rmsNorm(k, l.kNorm, c.NormEps)
	case c.QKNorm:
		q = g.reshape(g.rmsNorm(g.reshape(q, 1, n, c.Heads, c.HeadDim), l.qNorm, c.NormEps), 1, n, c.Heads*c.HeadDim)
		k = g.reshape(g.rmsNorm(g.reshape(k, 1, n, c.KVHeads, c.HeadDim), l.kNorm, c.NormEps), 1, n, c.KVHeads*c.HeadDim)
	}
	q = m.rotate(g, li, tokens(q, c.Heads), positions, p)
	k = m.rotate(g, li, tokens(k, c.KVHeads), positions, p)
	v = tokens(v, c.KVHeads)
	kd := []int{n * c.KVHeads, 1, c.HeadDim}
	m.writeKV(g, li, p.writes[m.pool.lay.group[li]], g.concat(0, g.reshape(k, kd...), g.reshape(v, kd...)))
	var outs []arr
	if len(p.dec) > 0 {
		outs = append(outs, m.attendDecode(g, li, p, q))
	}
	for _, grp := range p.pre {
		outs = append(outs, m.attend(g, li, grp, p.start[grp.feeds[0]], q, k, v))
	}
	o := g.concat(0, outs...)
	if !isNull(p.perm) {
		o = g.take(o, p.perm, 0)
	}
	return m.proj(g, li, pO, &l.o, g.reshape(o, 1, n, c.Heads*c.HeadDim), p)
}

// rotate applies layer li's RoPE to x [N, heads, 1, D] at positions [N].
// With longrope a token rotates with the long frequencies once its
// sequence passes original_max_position_embeddings (planLongRoPE).
func (m *model) rotate(g *graph, li int, x, positions arr, p *stepPlan) arr {
	r := &m.w.ropes[m.w.layers[li].rope]
	if !isNull(r.mscale) {
		x = g.mul(x, r.mscale)
	}
	short := func() arr { return g.ropeAt(x, r.dims, r.theta, r.scale, positions, r.freqs) }
	long := func() arr { return g.ropeAt(x, r.dims, r.theta, r.scale, positions, r.long) }
	switch {
	case isNull(r.long) || (!p.longAll && isNull(p.longMask)):
		return short()
	case p.longAll:
		return long()
	}
	return g.where(p.longMask, long(), short())
}

// mlp is layer li's feed-forward over h [1, N, hidden]: dense (silu or
// GELU-tanh gated) or a mixture of experts.
func (m *model) mlp(g *graph, li int, h arr, p *stepPlan) arr {
	c, l, n := m.cfg, &m.w.layers[li], p.n
	if l.moe != nil {
		return g.reshape(m.mixture(g, l.moe, h, n), 1, n, c.Hidden)
	}
	var gate, up arr
	if !isNull(l.gateUp.w) {
		y := m.proj(g, li, pGateUp, &l.gateUp, h, p)
		gate = g.slice(y, []int{0, 0, 0}, []int{1, n, c.Intermediate})
		up = g.slice(y, []int{0, 0, c.Intermediate}, []int{1, n, 2 * c.Intermediate})
	} else {
		gate, up = m.proj(g, li, pGate, &l.gate, h, p), m.proj(g, li, pUp, &l.up, h, p)
	}
	if c.Act == "silu" {
		return m.proj(g, li, pDown, &l.down, g.swiglu(gate, up), p)
	}
	return m.proj(g, li, pDown, &l.down, g.mul(geluTanh(g, gate), up), p)
}

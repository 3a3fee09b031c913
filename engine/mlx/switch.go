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

// experts is a sparse layer's router and its experts' projections, each
// stacked over experts into one linear of [E, out, in] (packed when
// quantized), as mlx-lm's SwitchGLU holds them.
type experts struct {
	router         linear
	gate, up, down linear
}

// experts stacks layer p's experts (moe.go) into [E, out, in] tensors.
func (b *builder) experts(p string) *experts {
	m := b.c.MoE
	if m.Stacked {
		return b.stackedExperts(p)
	}
	e := &experts{router: b.lin(p + m.Router)}
	e.gate, e.up, e.down = b.stack(p, m.Gate), b.stack(p, m.Up), b.stack(p, m.Down)
	return e
}

// stack takes projection proj of every expert under layer prefix p and
// returns them stacked. Quantized experts must share group size and bits.
func (b *builder) stack(p, proj string) linear {
	g, m := b.g, b.c.MoE
	var ws, ss, bs []arr
	var q *quantParams
	for j := range m.Experts {
		name := p + fmt.Sprintf(m.Expert, j) + proj
		mod := b.mods[name]
		if j == 0 {
			q = mod.Quant
		} else if (q == nil) != (mod.Quant == nil) || (q != nil && *q != *mod.Quant) {
			b.err = fmt.Errorf("mlx: %s: experts quantized differently", name)
		}
		if perm := b.take(name + ".perm"); !isNull(perm) {
			free(&perm)
			if b.err == nil {
				b.err = &engine.CheckpointError{Path: "the checkpoint's safetensors", Tensor: name,
					Reason: "act order (its g_idx or weight_g_idx is not input / group_size) in a mixture's experts: unsupported (their products are gathered over experts)"}
			}
		}
		one := func(a arr) arr { return g.expandDims(a, 0) }
		w := b.take(name + ".weight")
		ws = append(ws, one(w))
		free(&w)
		if mod.Quant != nil {
			s, bi := b.take(name+".scales"), b.take(name+".biases")
			ss, bs = append(ss, one(s)), append(bs, one(bi))
			free(&s)
			free(&bi)
		}
	}
	l := linear{q: q, w: g.keep(g.concat(0, ws...))}
	if q != nil {
		l.scales, l.biases = g.keep(g.concat(0, ss...)), g.keep(g.concat(0, bs...))
	} else {
		l.wT = b.gatherable(g.transpose(l.w, 0, 2, 1))
	}
	return l
}

// gatherable keeps float experts wT for gather_mm: as they are, or in
// float32 on the CPU, whose gather_mm takes only float32 (gather casts
// its input to it and the product back).
func (b *builder) gatherable(wT arr) arr {
	g := b.g
	if g.k.cpu && dtype(wT) != C.MLX_FLOAT32 {
		wT = g.astype(wT, C.MLX_FLOAT32)
	}
	return g.keep(wT)
}

// gather is x @ W[idx]^T for the experts idx picks (gatherMM).
func (l *linear) gather(g *graph, x, idx arr, sorted bool) arr {
	if l.q != nil {
		y := g.gatherQMM(x, l.w, l.scales, l.biases, idx, *l.q, sorted)
		return l.addExpertBias(g, y, idx)
	}
	if dt := dtype(x); dt != dtype(l.wT) { // float32 experts on the CPU (gatherable)
		y := g.astype(g.gatherMM(g.astype(x, dtype(l.wT)), l.wT, idx, sorted), dt)
		return l.addExpertBias(g, y, idx)
	}
	return l.addExpertBias(g, g.gatherMM(x, l.wT, idx, sorted), idx)
}

// sortAt is the number of (token, expert) pairs from which the experts'
// inputs are sorted by expert before the gathered products, so that each
// expert's rows are contiguous (mlx-lm's SwitchGLU does so from 64).
const sortAt = 64

// mixture is a sparse layer's MLP over h (N*hidden values), returned as
// [N, hidden]: router logits, softmax in float32, top-k (renormalised
// when the family says so; gpt-oss: top-k of the logits, then their
// softmax), the k experts' SwiGLU (gpt-oss: its clamped GLU) through
// gather_mm, summed by weight.
func (m *model) mixture(g *graph, e *experts, h arr, n int) arr {
	c, mc := m.cfg, m.cfg.MoE
	k, d := mc.TopK, c.Hidden
	x := g.reshape(h, n, d)
	logits := g.astype(e.router.apply(g, x), C.MLX_FLOAT32)
	probs := logits
	if !mc.SoftmaxTopK {
		probs = g.softmax(logits, -1)
	}
	inds := g.slice(g.argpartition(g.neg(probs), k-1, -1), []int{0, 0}, []int{n, k})
	scores := g.takeAlong(probs, inds, -1)
	switch {
	case mc.SoftmaxTopK:
		scores = g.softmax(scores, -1)
	case mc.NormTopK:
		scores = g.div(scores, g.sumKeep(scores, -1))
	}
	scores = g.astype(scores, m.w.dtype)
	glu := func(x, idx arr, sorted bool) arr {
		if mc.Stacked {
			return e.down.gather(g, gptOssGLU(g, e.gate.gather(g, x, idx, sorted), mc.Inter, mc.Limit), idx, sorted)
		}
		return e.down.gather(g, g.swiglu(e.gate.gather(g, x, idx, sorted), e.up.gather(g, x, idx, sorted)), idx, sorted)
	}
	var y arr
	if n*k >= sortAt {
		flat := g.reshape(inds, n*k)
		order := g.argsort(flat, 0)
		inv := g.argsort(order, 0)
		xs := g.take(g.reshape(x, n, 1, d), g.floorDiv(order, g.u32(uint32(k))), 0)
		y = g.take(glu(xs, g.take(flat, order, 0), true), inv, 0) // [N*k, 1, hidden]
	} else {
		y = glu(g.reshape(x, n, 1, 1, d), inds, false) // [N, k, 1, hidden]
	}
	y = g.sumKeep(g.mul(g.reshape(y, n, k, d), g.reshape(scores, n, k, 1)), 1)
	return g.reshape(y, n, d)
}

//go:build mlx

package mlx

/*
#include "mlx/c/mlx.h"
*/
import "C"

import (
	"slices"

	"github.com/mlxserving/mlxserving/engine"
)

// stackedExperts takes gpt-oss's router and stacked experts under layer
// prefix p (gptoss.go). gate_up_proj's interleaved columns are reordered
// at load, gates first, so a product's first Inter outputs are the gates
// and the rest the ups; MXFP4 experts keep their bytes, as MLX's mxfp4.
func (b *builder) stackedExperts(p string) *experts {
	m := b.c.MoE
	e := &experts{router: b.lin(p + m.Router)}
	e.gate = b.stackedLinear(p+m.Expert+m.Gate, true)
	e.down = b.stackedLinear(p+m.Expert+m.Down, false)
	return e
}

// stackedLinear is the stacked experts name, with its bias: float
// [E, in, out] as gather_mm reads them (wT), or MXFP4 blocks as MLX's
// packed [E, out, in/8] words with their E8M0 scales. interleaved
// reorders the outputs 0, 2, 4, ..., 1, 3, 5, ....
func (b *builder) stackedLinear(name string, interleaved bool) linear {
	g, mod := b.g, b.mods[name]
	var perm arr
	if interleaved {
		idx := make([]int32, mod.Out)
		for j := range mod.Out / 2 {
			idx[j], idx[mod.Out/2+j] = int32(2*j), int32(2*j+1)
		}
		perm = g.int32s(idx, mod.Out)
	}
	order := func(a arr, axis int) arr {
		if isNull(perm) {
			return a
		}
		return g.take(a, perm, axis)
	}
	l := linear{q: mod.Quant}
	bias := b.take(name + "_bias")
	l.bias = g.keep(order(bias, 1))
	free(&bias)
	if mod.Quant == nil {
		w := b.take(name)
		l.wT = b.gatherable(order(w, 2))
		free(&w)
		return l
	}
	blocks, scales := b.take(name+"_blocks"), b.take(name+"_scales")
	b.checkScales(name+"_scales", scales)
	words := g.view(g.reshape(blocks, mod.Experts, mod.Out, mod.In/2), C.MLX_UINT32)
	l.w, l.scales = g.keep(order(words, 1)), g.keep(order(scales, 1))
	free(&blocks)
	free(&scales)
	return l
}

// checkScales refuses MXFP4 scales holding 0xFF, NaN in E8M0.
func (b *builder) checkScales(name string, scales arr) {
	g := b.g
	if b.err != nil || g.err != nil {
		return
	}
	top := g.astype(g.maxKeep(g.reshape(scales, int(C.mlx_array_size(scales))), 0), C.MLX_INT32)
	g.eval(top)
	if g.err != nil {
		return
	}
	if v, err := readInt32s(top); err == nil && len(v) == 1 && v[0] == 0xFF {
		b.err = &engine.CheckpointError{Path: "the checkpoint's safetensors", Tensor: name, Reason: "MXFP4 scale 0xFF (NaN in E8M0)"}
	}
}

// addExpertBias adds each picked expert's bias (stacked [E, out]) to
// the gathered product y [..., 1, out] of experts idx [...].
func (l *linear) addExpertBias(g *graph, y, idx arr) arr {
	if isNull(l.bias) {
		return y
	}
	return g.add(y, g.expandDims(g.take(l.bias, idx, 0), -2))
}

// gptOssGLU is gpt-oss's expert activation over the gathered gate_up
// product y [..., 2·inter] (gates first, stackedLinear):
// (clip(up, ±limit) + 1) · gate·σ(1.702·gate), gate at most limit.
func gptOssGLU(g *graph, y arr, inter int, limit float32) arr {
	s := shapeOf(y)
	n := len(s)
	lo, hi := make([]int, n), slices.Clone(s)
	hi[n-1] = inter
	gate := g.slice(y, lo, hi)
	lo2 := make([]int, n)
	lo2[n-1] = inter
	up := g.slice(y, lo2, s)
	dt := dtype(y)
	lim, neg := g.scalarOf(limit, dt), g.scalarOf(-limit, dt)
	gate = g.minimum(gate, lim)
	up = g.clip(up, neg, lim)
	glu := g.mul(gate, g.sigmoid(g.mul(gate, g.scalarOf(gptOssGLUScale, dt))))
	return g.mul(g.add(up, g.scalarOf(1, dt)), glu)
}

func (g *graph) minimum(a, b arr) arr {
	return g.op("minimum", func(r *arr) C.int { return C.mlx_minimum(r, a, b, g.s) })
}

func (g *graph) clip(a, lo, hi arr) arr {
	return g.op("clip", func(r *arr) C.int { return C.mlx_clip(r, a, lo, hi, g.s) })
}

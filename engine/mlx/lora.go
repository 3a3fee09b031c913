//go:build mlx

package mlx

/*
#include "mlx/c/mlx.h"
*/
import "C"

import (
	"fmt"

	"github.com/mlxserving/mlxserving/internal/lora"
)

// maxAdapterSlots bounds ModelSpec.AdapterSlots: MLX's CUDA gather_mm
// takes at most 1024 matrices (the slots) in its sorted one-row path.
const maxAdapterSlots = 1024

// projKind names a layer's linear layers as the engine holds them: q, k
// and v fused into qkv, gate and up into gateUp, when fuse could (or the
// checkpoint stores them so: phi3), else apart.
type projKind int

const (
	pQKV projKind = iota
	pQ
	pK
	pV
	pO
	pGateUp
	pGate
	pUp
	pDown
	nProj
)

// loraStack is the device side of the adapter slots. Every adaptable
// module of every layer (a loraPart: q_proj, down_proj, phi3's qkv_proj
// ...) has two stacks over the slots, made when the first resident
// adapter targets it: A^T [slots, in, R] and scale·B^T [slots, R, out] in
// the model's dtype (float32 on the CPU, whose gather_mm takes only
// float32: the step's rows are cast to it and back), R the highest rank made resident so far (lower ranks
// are zero-padded, which adds nothing), a slot's rows zero when its
// adapter does not target the module. A projection that packs modules
// (the fused q/k/v product) adds their deltas side by side, in its
// output's order. MLX thread only.
type loraStack struct {
	dt     C.mlx_dtype // the stacks'
	model  C.mlx_dtype // the model's
	slots  int
	rank   int
	layers [][nProj]*loraProj
	parts  map[partKey]*loraPart
}

type partKey struct {
	layer  int
	module string
}

// loraProj is the modules packed into one of a layer's linear layers, in
// the order of its output.
type loraProj struct{ parts []*loraPart }

// loraPart is one module's stacks.
type loraPart struct {
	in, out int
	a, b    arr    // [slots, in, R] and [slots, R, out]; null until a resident adapter targets the module
	has     []bool // slots whose adapter targets the module (rows that may be nonzero)
}

// newLoRAStack lays out the adaptable modules of m's layers; it takes no
// device memory.
func newLoRAStack(m *model, slots int, cpu bool) *loraStack {
	c := m.cfg
	st := &loraStack{dt: m.w.dtype, model: m.w.dtype, slots: slots, layers: make([][nProj]*loraProj, len(m.w.layers)), parts: map[partKey]*loraPart{}}
	if cpu {
		st.dt = C.MLX_FLOAT32
	}
	h, qd, kd, inter := c.Hidden, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim, c.Intermediate
	for li := range m.w.layers {
		l, ps := &m.w.layers[li], &st.layers[li]
		mk := func(module string, in, out int) *loraPart {
			p := &loraPart{in: in, out: out, has: make([]bool, slots)}
			st.parts[partKey{li, module}] = p
			return p
		}
		one := func(module string, in, out int) *loraProj { return &loraProj{parts: []*loraPart{mk(module, in, out)}} }
		switch {
		case c.FusedQKV:
			ps[pQKV] = one("self_attn.qkv_proj", h, qd+2*kd)
		case !isNull(l.qkv.w):
			ps[pQKV] = &loraProj{parts: []*loraPart{mk("self_attn.q_proj", h, qd), mk("self_attn.k_proj", h, kd), mk("self_attn.v_proj", h, kd)}}
		default:
			ps[pQ], ps[pK], ps[pV] = one("self_attn.q_proj", h, qd), one("self_attn.k_proj", h, kd), one("self_attn.v_proj", h, kd)
		}
		ps[pO] = one("self_attn.o_proj", qd, h)
		if l.moe != nil { // experts are not adapted (lora.Base.Dense)
			continue
		}
		switch {
		case c.FusedGateUp:
			ps[pGateUp] = one("mlp.gate_up_proj", h, 2*inter)
		case !isNull(l.gateUp.w):
			ps[pGateUp] = &loraProj{parts: []*loraPart{mk("mlp.gate_proj", h, inter), mk("mlp.up_proj", h, inter)}}
		default:
			ps[pGate], ps[pUp] = one("mlp.gate_proj", h, inter), one("mlp.up_proj", h, inter)
		}
		ps[pDown] = one("mlp.down_proj", inter, h)
	}
	return st
}

// part is layer's module, nil when the engine does not adapt it.
func (st *loraStack) part(layer int, module string) *loraPart {
	return st.parts[partKey{layer, module}]
}

// free releases the stacks.
func (st *loraStack) free() {
	for _, p := range st.parts {
		free(&p.a)
		free(&p.b)
	}
}

// load writes adapter a into slot: its weights where it targets a module,
// zeros where an earlier adapter of the slot left some. It reads the
// weights from disk.
func (st *loraStack) load(g *graph, slot int, a *lora.Adapter) error {
	if a.Rank > st.rank {
		st.grow(g, a.Rank)
	}
	targeted := map[*loraPart]lora.Pair{}
	for _, pr := range a.Pairs {
		targeted[st.part(pr.Layer, pr.Module)] = pr
	}
	for _, p := range st.parts {
		pr, ok := targeted[p]
		switch {
		case ok:
			A, B, err := a.Load(pr)
			if err != nil {
				p.has[slot] = true // maybe written before: zeroed by the slot's next load
				return err
			}
			p.has[slot] = true
			st.write(g, p, slot, a.Rank, float32(a.Scale), A, B)
		case p.has[slot]:
			st.write(g, p, slot, 0, 0, nil, nil)
			p.has[slot] = false
		}
		if g.err != nil {
			return fmt.Errorf("mlx: loading adapter %s: %w", a.Dir, g.err)
		}
	}
	return nil
}

// write sets slot's rows of p to A^T and scale·B^T (A [r, in], B [out,
// r]) padded to the stack's rank, or to zeros when r is 0, allocating
// p's stacks first if need be. Evaluated at once, so that the old stack
// is updated in place and one module's host copy is alive at a time.
func (st *loraStack) write(g *graph, p *loraPart, slot, r int, scale float32, A, B []float32) {
	R := st.rank
	if isNull(p.a) {
		p.a = g.keep(g.zeros(st.dt, st.slots, p.in, R))
		p.b = g.keep(g.zeros(st.dt, st.slots, R, p.out))
	}
	var ua, ub arr
	if r == 0 {
		ua, ub = g.zeros(st.dt, 1, p.in, R), g.zeros(st.dt, 1, R, p.out)
	} else {
		at, bt := make([]float32, p.in*R), make([]float32, R*p.out)
		for k := range r {
			for j := range p.in {
				at[j*R+k] = A[k*p.in+j]
			}
			for i := range p.out {
				bt[k*p.out+i] = scale * B[i*r+k]
			}
		}
		ua = g.astype(g.float32s(at, 1, p.in, R), st.dt)
		ub = g.astype(g.float32s(bt, 1, R, p.out), st.dt)
	}
	na := g.keep(g.sliceUpdate(p.a, ua, []int{slot, 0, 0}, []int{slot + 1, p.in, R}))
	nb := g.keep(g.sliceUpdate(p.b, ub, []int{slot, 0, 0}, []int{slot + 1, R, p.out}))
	free(&p.a)
	free(&p.b)
	p.a, p.b = na, nb
	g.eval(p.a, p.b)
}

// grow zero-pads every stack to rank r.
func (st *loraStack) grow(g *graph, r int) {
	d := r - st.rank
	for _, p := range st.parts {
		if isNull(p.a) {
			continue
		}
		na := g.keep(g.concat(2, p.a, g.zeros(st.dt, st.slots, p.in, d)))
		nb := g.keep(g.concat(1, p.b, g.zeros(st.dt, st.slots, d, p.out)))
		free(&p.a)
		free(&p.b)
		p.a, p.b = na, nb
		g.eval(p.a, p.b)
	}
	st.rank = r
}

// loraPlan is where a step's adapted tokens are: the packed tokens of
// sequences with an adapter, grouped by slot in increasing order, so
// each slot's rows are contiguous for the sorted gather_mm; the deltas
// are added back to those rows with one scatter_add.
type loraPlan struct {
	m     int    // adapted tokens
	idx   arr    // [M] packed token of each, by slot; null: every token, in order
	slots arr    // [M] uint32 slot of each, increasing
	used  []bool // slots of the step
}

// planLoRA lays out the step's adapted tokens; nil when no feed has an
// adapter, and the step then runs no LoRA op at all.
func (m *model) planLoRA(g *graph, feeds []feed, p *stepPlan) *loraPlan {
	if m.adapters == nil {
		return nil
	}
	nslots := len(m.adapters.slots)
	bySlot := make([][]int32, nslots)
	any := false
	for i, f := range feeds {
		if f.seq.lora == nil {
			continue
		}
		any = true
		for j := range f.tokens {
			bySlot[f.seq.slot] = append(bySlot[f.seq.slot], int32(p.start[i]+j))
		}
	}
	if !any {
		return nil
	}
	lp := &loraPlan{used: make([]bool, nslots)}
	var idx []int32
	var slots []uint32
	for s, toks := range bySlot {
		lp.used[s] = len(toks) > 0
		idx = append(idx, toks...)
		for range toks {
			slots = append(slots, uint32(s))
		}
	}
	lp.m = len(idx)
	lp.slots = g.uint32s(slots, lp.m)
	inOrder := lp.m == p.n
	for i, t := range idx {
		inOrder = inOrder && int(t) == i
	}
	if inOrder {
		return lp
	}
	lp.idx = g.int32s(idx, lp.m)
	return lp
}

// uses reports whether a slot of the step has weights for part.
func (lp *loraPlan) uses(part *loraPart) bool {
	if isNull(part.a) {
		return false
	}
	for s, u := range lp.used {
		if u && part.has[s] {
			return true
		}
	}
	return false
}

// proj is layer li's linear l (of kind k) over x, plus the LoRA deltas
// of the step's adapted tokens: for each module packed in it,
// (x A^T) (scale·B^T) through two sorted gather_mm over the tokens
// grouped by slot, the modules' deltas side by side, added to the
// adapted tokens' rows only.
func (m *model) proj(g *graph, li int, k projKind, l *linear, x arr, p *stepPlan) arr {
	y := l.apply(g, x)
	lp := p.lora
	if lp == nil || g.err != nil {
		return y
	}
	pr := m.adapters.stack.layers[li][k]
	if pr == nil {
		return y
	}
	st := m.adapters.stack
	var xs arr
	outs := make([]arr, len(pr.parts))
	some, width := false, 0
	for i, part := range pr.parts {
		width += part.out
		if !lp.uses(part) {
			outs[i] = g.zeros(st.dt, lp.m, 1, part.out)
			continue
		}
		if isNull(xs) {
			xs = g.reshape(x, p.n, 1, part.in)
			if !isNull(lp.idx) {
				xs = g.take(xs, lp.idx, 0)
			}
			if st.dt != st.model {
				xs = g.astype(xs, st.dt)
			}
		}
		u := g.gatherMM(xs, part.a, lp.slots, true)     // [M, 1, R]
		outs[i] = g.gatherMM(u, part.b, lp.slots, true) // [M, 1, out]
		some = true
	}
	if !some {
		return y
	}
	d := g.concat(2, outs...)
	if st.dt != st.model {
		d = g.astype(d, st.model)
	}
	if isNull(lp.idx) {
		return g.add(y, g.reshape(d, shapeOf(y)...))
	}
	shape := shapeOf(y)
	return g.reshape(g.scatterAdd(g.reshape(y, p.n, width), lp.idx, d), shape...) // idx's rows are distinct
}

// bytes is the memory the stacks take with every module adapted in every
// slot at rank r (they are padded to the highest rank resident, and
// allocated per module as adapters first target it): Info.AdapterBytes
// at the model's highest rank.
func (st *loraStack) bytes(r int) int64 {
	var n int64
	for _, p := range st.parts {
		n += int64(p.in + p.out)
	}
	return n * int64(st.slots) * int64(r) * int64(dtypeSize(st.dt))
}

// dtypeSize is the bytes of one value of the float dtype dt.
func dtypeSize(dt C.mlx_dtype) int {
	if dt == C.MLX_FLOAT32 {
		return 4
	}
	return 2
}

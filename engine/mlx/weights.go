//go:build mlx

package mlx

/*
#include <stdlib.h>
#include "mlx/c/mlx.h"
*/
import "C"

import (
	"context"
	"slices"
	"unsafe"

	"github.com/mlxserving/mlxserving/engine"
)

// linear is a linear layer (or embedding) in float or MLX affine form.
type linear struct {
	w, wT, scales, biases, bias arr
	// perm, when set, is the order of the inputs W's columns hold (an
	// act-order GPTQ module's, hfint4.go's actOrder): apply gathers x's
	// last axis in it first.
	perm arr
	q    *quantParams
}

func (l *linear) free() {
	for _, a := range []*arr{&l.w, &l.wT, &l.scales, &l.biases, &l.bias, &l.perm} {
		free(a)
	}
}

// apply computes x @ W^T (+ bias), x[..., perm] @ W^T with a perm.
func (l *linear) apply(g *graph, x arr) arr {
	if !isNull(l.perm) {
		x = g.take(x, l.perm, int(C.mlx_array_ndim(x))-1)
	}
	var y arr
	if l.q != nil {
		y = g.quantizedMatmul(x, l.w, l.scales, l.biases, l.q.GroupSize, l.q.Bits)
	} else {
		y = g.matmul(x, l.wT)
	}
	if !isNull(l.bias) {
		y = g.add(y, l.bias)
	}
	return y
}

// rows gathers embedding rows for ids.
func (l *linear) rows(g *graph, ids arr) arr {
	if l.q == nil {
		return g.take(l.w, ids, 0)
	}
	w, s, b := g.take(l.w, ids, 0), g.take(l.scales, ids, 0), g.take(l.biases, ids, 0)
	return g.dequantize(w, s, b, l.q.GroupSize, l.q.Bits)
}

type layer struct {
	// inNorm is input_layernorm, postNorm post_attention_layernorm;
	// preFF and postFF are the feed-forward norms of sandwich and
	// post-norm layers (arch.Block).
	inNorm, postNorm, preFF, postFF, qNorm, kNorm arr
	q, k, v, o, gate, up, down                    linear
	// qkv and gateUp are q, k, v and gate, up fused into one product each
	// (outputs side by side); when set, the parts are empty.
	qkv, gateUp linear
	// moe holds a sparse layer's router and stacked experts (switch.go);
	// gate, up and down are then empty.
	moe *experts
	// sinks is the attention sink logit of every head [heads] (gpt-oss),
	// or null.
	sinks arr
	// rope indexes weights.ropes: how this layer rotates.
	rope int
}

// fuse concatenates linears that read the same input into one whose
// output is theirs side by side, and frees the parts. It returns false,
// changing nothing, when they differ in form (float or quantized, group
// size and bits, bias or not, input order).
func fuse(g *graph, parts ...*linear) (linear, bool) {
	p0 := parts[0]
	for _, p := range parts[1:] {
		if (p.q == nil) != (p0.q == nil) || (p.q != nil && *p.q != *p0.q) || isNull(p.bias) != isNull(p0.bias) || !samePerm(p.perm, p0.perm) {
			return linear{}, false
		}
	}
	cat := func(get func(*linear) arr) arr {
		if isNull(get(p0)) {
			return arr{}
		}
		as := make([]arr, len(parts))
		for i, p := range parts {
			as[i] = get(p)
		}
		return g.keep(g.concat(0, as...))
	}
	f := linear{q: p0.q, w: cat(func(l *linear) arr { return l.w }), bias: cat(func(l *linear) arr { return l.bias })}
	if f.q != nil {
		f.scales, f.biases = cat(func(l *linear) arr { return l.scales }), cat(func(l *linear) arr { return l.biases })
	} else {
		f.wT = g.keep(g.transpose(f.w, 1, 0))
	}
	if g.err != nil {
		f.free()
		return linear{}, false
	}
	f.perm, p0.perm = p0.perm, arr{} // the parts' one order
	for _, p := range parts {
		p.free()
		*p = linear{}
	}
	return f, true
}

// samePerm reports whether two evaluated input orders (or none) are equal.
func samePerm(a, b arr) bool {
	if isNull(a) || isNull(b) {
		return isNull(a) == isNull(b)
	}
	x, err := readInt32s(a)
	if err != nil {
		return false
	}
	y, err := readInt32s(b)
	return err == nil && slices.Equal(x, y)
}

// weights are a loaded model's arrays, all kept handles.
type weights struct {
	embed, head linear // head is unused when tied
	norm        arr
	layers      []layer
	ropes       []ropeSet // [0] global; [1] Gemma 3's sliding layers
	invf        []float32 // RoPE's inverse frequencies, for the fused decode kernels
	embedScale  arr       // scalar of the weights' dtype (Gemma) or null
	dtype       C.mlx_dtype
}

// ropeSet is how a layer rotates queries and keys: MLX fast rope of the
// first dims of each head with base theta and position scale, or custom
// frequencies; longrope adds its long frequencies, longrope and yarn the
// factor on the rotated dims.
type ropeSet struct {
	dims         int
	theta, scale float32
	freqs        arr // custom frequencies (llama3, yarn; longrope's short) or null
	long         arr // longrope's long frequencies, or null
	mscale       arr // [D] longrope's or yarn's attention factor on the rotated dims, 1 elsewhere; or null
}

func (w *weights) free() {
	w.embed.free()
	w.head.free()
	free(&w.norm)
	free(&w.embedScale)
	for i := range w.ropes {
		r := &w.ropes[i]
		free(&r.freqs)
		free(&r.long)
		free(&r.mscale)
	}
	for i := range w.layers {
		l := &w.layers[i]
		for _, a := range []*arr{&l.inNorm, &l.postNorm, &l.preFF, &l.postFF, &l.qNorm, &l.kNorm, &l.sinks} {
			free(a)
		}
		for _, m := range l.linears() {
			m.free()
		}
	}
}

// linears lists the layer's linear layers, the experts' included.
func (l *layer) linears() []*linear {
	ls := []*linear{&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &l.qkv, &l.gateUp}
	if l.moe != nil {
		ls = append(ls, &l.moe.router, &l.moe.gate, &l.moe.up, &l.moe.down)
	}
	return ls
}

// loadTensors reads the named tensors of every file through
// mlx_load_safetensors, keeping handles to those in want.
func loadTensors(ctx context.Context, g *graph, files []string, want map[string]bool) (map[string]arr, error) {
	out := map[string]arr{}
	fail := func(err error) (map[string]arr, error) {
		for _, a := range out {
			free(&a)
		}
		return nil, err
	}
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		if err := loadFile(g, f, want, out); err != nil {
			return fail(err)
		}
	}
	return out, nil
}

func loadFile(g *graph, file string, want map[string]bool, out map[string]arr) error {
	cpath := C.CString(file)
	defer C.free(unsafe.Pointer(cpath))
	tensors := C.mlx_map_string_to_array_new()
	meta := C.mlx_map_string_to_string_new()
	defer C.mlx_map_string_to_array_free(tensors)
	defer C.mlx_map_string_to_string_free(meta)
	if rc := C.mlx_load_safetensors(&tensors, &meta, cpath, g.s); rc != 0 {
		return &engine.CheckpointError{Path: file, Reason: errMLX("load_safetensors", rc).Error()}
	}
	it := C.mlx_map_string_to_array_iterator_new(tensors)
	defer C.mlx_map_string_to_array_iterator_free(it)
	for {
		var key *C.char
		var val arr
		switch rc := C.mlx_map_string_to_array_iterator_next(&key, &val, it); rc {
		case 0:
		case 2: // end of map
			return nil
		default:
			return &engine.CheckpointError{Path: file, Reason: errMLX("reading tensors", rc).Error()}
		}
		if name := C.GoString(key); want[name] {
			out[name] = val
			continue
		}
		C.mlx_array_free(val)
	}
}

// buildWeights assembles the model from loaded tensors (taking ownership of
// them) and evaluates everything, so that loading is done when it returns.
func buildWeights(g *graph, c *modelConfig, mods []module, ts map[string]arr) (*weights, error) {
	b := &builder{g: g, c: c, ts: ts, mods: map[string]module{}}
	for _, m := range mods {
		b.mods[m.Name] = m
	}
	w := &weights{embed: b.lin(c.Prefix + "embed_tokens"), norm: b.norm(c.Prefix + "norm"), layers: make([]layer, c.Layers)}
	if !c.Tied {
		w.head = b.lin(c.Head)
	}
	for i := range w.layers {
		w.layers[i] = b.layer(i)
	}
	for _, a := range ts { // not part of the model (e.g. rotary_emb.inv_freq)
		free(&a)
	}
	if w.embed.q != nil {
		w.dtype = C.mlx_array_dtype(w.embed.scales)
	} else {
		w.dtype = C.mlx_array_dtype(w.embed.w)
	}
	if c.EmbedScale != 0 {
		w.embedScale = g.keep(g.scalarOf(c.EmbedScale, w.dtype))
	}
	w.ropes = ropeSets(g, c, w.dtype)
	w.invf = invFreqs(c)
	g.eval(w.all()...)
	if b.err != nil && g.err == nil {
		g.err = b.err
	}
	if g.err != nil {
		w.free()
		return nil, g.err
	}
	return w, nil
}

// builder takes a checkpoint's tensors into a model's arrays.
type builder struct {
	g    *graph
	c    *modelConfig
	ts   map[string]arr
	mods map[string]module
	err  error // a checkpoint the config check let through but the arrays cannot hold
}

func (b *builder) take(name string) arr { a := b.ts[name]; delete(b.ts, name); return a }

func (b *builder) lin(name string) linear {
	m := b.mods[name]
	l := linear{w: b.take(name + ".weight"), bias: b.take(name + ".bias"), perm: b.take(name + ".perm"), q: m.Quant}
	if m.Quant != nil {
		l.scales, l.biases = b.take(name+".scales"), b.take(name+".biases")
	} else if m.In != 0 {
		l.wT = b.g.keep(b.g.transpose(l.w, 1, 0))
	}
	return l
}

// norm takes an RMSNorm weight: as stored, or 1 + weight (computed in
// float32, then cast back) for Gemma's norms.
func (b *builder) norm(name string) arr {
	w := b.take(name + ".weight")
	if !b.c.NormPlusOne || isNull(w) {
		return w
	}
	g := b.g
	one := g.add(g.astype(w, C.MLX_FLOAT32), g.scalar(1))
	out := g.keep(g.astype(one, C.mlx_array_dtype(w)))
	free(&w)
	return out
}

func (b *builder) layer(i int) layer {
	c, g := b.c, b.g
	p := c.Prefix + "layers." + itoa(i) + "."
	l := layer{postNorm: b.norm(p + "post_attention_layernorm"), o: b.lin(p + "self_attn.o_proj")}
	if c.Block != postNorm {
		l.inNorm = b.norm(p + "input_layernorm")
	}
	if c.Block != preNorm {
		l.postFF = b.norm(p + "post_feedforward_layernorm")
	}
	if c.Block == sandwich {
		l.preFF = b.norm(p + "pre_feedforward_layernorm")
	}
	if c.QKNorm {
		l.qNorm, l.kNorm = b.norm(p+"self_attn.q_norm"), b.norm(p+"self_attn.k_norm")
	}
	if c.Sinks {
		l.sinks = b.take(p + "self_attn.sinks")
	}
	if c.FusedQKV {
		l.qkv = b.lin(p + "self_attn.qkv_proj")
	} else {
		l.q, l.k, l.v = b.lin(p+"self_attn.q_proj"), b.lin(p+"self_attn.k_proj"), b.lin(p+"self_attn.v_proj")
		l.qkv, _ = fuse(g, &l.q, &l.k, &l.v)
	}
	switch {
	case c.sparse(i):
		l.moe = b.experts(p)
	case c.FusedGateUp:
		l.gateUp, l.down = b.lin(p+"mlp.gate_up_proj"), b.lin(p+"mlp.down_proj")
	default:
		l.gate, l.up, l.down = b.lin(p+"mlp.gate_proj"), b.lin(p+"mlp.up_proj"), b.lin(p+"mlp.down_proj")
		l.gateUp, _ = fuse(g, &l.gate, &l.up)
	}
	if c.LocalRopeTheta != 0 && c.slides(i) {
		l.rope = 1
	}
	return l
}

// ropeSets makes the rotations of the model's layers: [0] with rope_theta
// and rope_scaling; [1] Gemma 3's sliding layers, rope_local_base_freq
// unscaled.
func ropeSets(g *graph, c *modelConfig, dt C.mlx_dtype) []ropeSet {
	r := ropeSet{dims: c.RotaryDim, theta: c.RopeTheta, scale: 1}
	if c.Rope.Type == "linear" {
		r.scale = float32(1 / c.Rope.Factor)
	}
	if f := ropeFreqs(c); f != nil {
		r.freqs = g.keep(g.float32s(f, len(f)))
	}
	if c.Rope.Type == "longrope" {
		short, long := longFreqs(c, false), longFreqs(c, true)
		r.freqs, r.long = g.keep(g.float32s(short, len(short))), g.keep(g.float32s(long, len(long)))
	}
	if s := c.Rope.AttnFactor; s != 0 && s != 1 {
		m := make([]float32, c.HeadDim)
		for i := range m {
			m[i] = 1
			if i < c.RotaryDim {
				m[i] = float32(s)
			}
		}
		r.mscale = g.keep(g.astype(g.float32s(m, len(m)), dt))
	}
	out := []ropeSet{r}
	if c.LocalRopeTheta != 0 {
		out = append(out, ropeSet{dims: c.RotaryDim, theta: c.LocalRopeTheta, scale: 1})
	}
	return out
}

func (w *weights) all() []arr {
	var out []arr
	add := func(as ...arr) {
		for _, a := range as {
			if !isNull(a) {
				out = append(out, a)
			}
		}
	}
	addLin := func(ls ...*linear) {
		for _, l := range ls {
			add(l.w, l.wT, l.scales, l.biases, l.bias, l.perm)
		}
	}
	addLin(&w.embed, &w.head)
	add(w.norm, w.embedScale)
	for _, r := range w.ropes {
		add(r.freqs, r.long, r.mscale)
	}
	for i := range w.layers {
		l := &w.layers[i]
		add(l.inNorm, l.postNorm, l.preFF, l.postFF, l.qNorm, l.kNorm, l.sinks)
		addLin(l.linears()...)
	}
	return out
}

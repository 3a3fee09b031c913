//go:build mlx

package mlx

/*
#include <stdlib.h>
#include "mlx/c/mlx.h"
*/
import "C"

import (
	"context"
	"unsafe"

	"github.com/mlxserving/mlxserving/engine"
)

// linear is a linear layer (or embedding) in float or MLX affine form.
type linear struct {
	w, wT, scales, biases, bias arr
	q                           *quantParams
}

func (l *linear) free() {
	for _, a := range []*arr{&l.w, &l.wT, &l.scales, &l.biases, &l.bias} {
		free(a)
	}
}

// apply computes x @ W^T (+ bias).
func (l *linear) apply(g *graph, x arr) arr {
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
	inNorm, postNorm, qNorm, kNorm arr
	q, k, v, o, gate, up, down     linear
	// qkv and gateUp are q, k, v and gate, up fused into one product each
	// (outputs side by side); when set, the parts are empty.
	qkv, gateUp linear
}

// fuse concatenates linears that read the same input into one whose
// output is theirs side by side, and frees the parts. It returns false,
// changing nothing, when they differ in form (float or quantized, group
// size and bits, bias or not).
func fuse(g *graph, parts ...*linear) (linear, bool) {
	p0 := parts[0]
	for _, p := range parts[1:] {
		if (p.q == nil) != (p0.q == nil) || (p.q != nil && *p.q != *p0.q) || isNull(p.bias) != isNull(p0.bias) {
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
	for _, p := range parts {
		p.free()
		*p = linear{}
	}
	return f, true
}

// weights are a loaded model's arrays, all kept handles.
type weights struct {
	embed, head linear // head is unused when tied
	norm        arr
	layers      []layer
	freqs       arr       // custom RoPE frequencies (llama3 scaling) or null
	invf        []float32 // RoPE's inverse frequencies, for the fused decode kernels
	dtype       C.mlx_dtype
}

func (w *weights) free() {
	w.embed.free()
	w.head.free()
	free(&w.norm)
	free(&w.freqs)
	for i := range w.layers {
		l := &w.layers[i]
		for _, a := range []*arr{&l.inNorm, &l.postNorm, &l.qNorm, &l.kNorm} {
			free(a)
		}
		for _, m := range []*linear{&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &l.qkv, &l.gateUp} {
			m.free()
		}
	}
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
	byName := map[string]module{}
	for _, m := range mods {
		byName[m.Name] = m
	}
	take := func(name string) arr { a := ts[name]; delete(ts, name); return a }
	lin := func(name string) linear {
		m := byName[name]
		l := linear{w: take(name + ".weight"), bias: take(name + ".bias"), q: m.Quant}
		if m.Quant != nil {
			l.scales, l.biases = take(name+".scales"), take(name+".biases")
		} else if m.In != 0 {
			l.wT = g.keep(g.transpose(l.w, 1, 0))
		}
		return l
	}
	w := &weights{embed: lin("model.embed_tokens"), norm: take("model.norm.weight"), layers: make([]layer, c.Layers)}
	if !c.Tied {
		w.head = lin("lm_head")
	}
	for i := range w.layers {
		p := "model.layers." + itoa(i) + "."
		w.layers[i] = layer{
			inNorm: take(p + "input_layernorm.weight"), postNorm: take(p + "post_attention_layernorm.weight"),
			q: lin(p + "self_attn.q_proj"), k: lin(p + "self_attn.k_proj"), v: lin(p + "self_attn.v_proj"),
			o: lin(p + "self_attn.o_proj"), gate: lin(p + "mlp.gate_proj"), up: lin(p + "mlp.up_proj"),
			down: lin(p + "mlp.down_proj"),
		}
		l := &w.layers[i]
		if c.QKNorm {
			l.qNorm, l.kNorm = take(p+"self_attn.q_norm.weight"), take(p+"self_attn.k_norm.weight")
		}
		l.qkv, _ = fuse(g, &l.q, &l.k, &l.v)
		l.gateUp, _ = fuse(g, &l.gate, &l.up)
	}
	for _, a := range ts { // not part of the model (e.g. rotary_emb.inv_freq)
		free(&a)
	}
	w.dtype = C.mlx_array_dtype(w.norm)
	if w.embed.q != nil {
		w.dtype = C.mlx_array_dtype(w.embed.scales)
	} else {
		w.dtype = C.mlx_array_dtype(w.embed.w)
	}
	if f := ropeFreqs(c); f != nil {
		w.freqs = g.keep(g.float32s(f, len(f)))
	}
	w.invf = invFreqs(c)
	g.eval(w.all()...)
	if g.err != nil {
		w.free()
		return nil, g.err
	}
	return w, nil
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
			add(l.w, l.wT, l.scales, l.biases, l.bias)
		}
	}
	addLin(&w.embed, &w.head)
	add(w.norm, w.freqs)
	for i := range w.layers {
		l := &w.layers[i]
		add(l.inNorm, l.postNorm, l.qNorm, l.kNorm)
		addLin(&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &l.qkv, &l.gateUp)
	}
	return out
}

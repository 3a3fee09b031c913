//go:build mlx

package mlx

/*
#include "mlx/c/mlx.h"
*/
import "C"

import (
	"context"
	"fmt"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/metal"
)

// encWeights are an encoder's arrays, all kept handles.
type encWeights struct {
	embed   linear // word (BERT) or token (ModernBERT) embeddings
	pos     arr    // BERT's position embeddings [positions, hidden]
	typ0    arr    // BERT's token type 0 embedding [hidden]
	embNorm lnorm
	layers  []encLayer
	final   lnorm // ModernBERT's final_norm
	dtype   C.mlx_dtype
}

// lnorm is a LayerNorm's weight and bias (null without one).
type lnorm struct{ w, b arr }

// encLayer is one encoder layer. BERT: attnNorm and mlpNorm follow the
// residual adds (post-LN); ModernBERT: they precede attention (null on
// layer 0: the identity) and the MLP.
type encLayer struct {
	qkv, o, up, down  linear
	attnNorm, mlpNorm lnorm
}

func (w *encWeights) arrays() []*arr {
	out := []*arr{&w.pos, &w.typ0, &w.embNorm.w, &w.embNorm.b, &w.final.w, &w.final.b}
	for i := range w.layers {
		l := &w.layers[i]
		out = append(out, &l.attnNorm.w, &l.attnNorm.b, &l.mlpNorm.w, &l.mlpNorm.b)
	}
	return out
}

func (w *encWeights) linears() []*linear {
	out := []*linear{&w.embed}
	for i := range w.layers {
		l := &w.layers[i]
		out = append(out, &l.qkv, &l.o, &l.up, &l.down)
	}
	return out
}

func (w *encWeights) free() {
	for _, a := range w.arrays() {
		free(a)
	}
	for _, l := range w.linears() {
		l.free()
	}
}

// all lists the arrays to evaluate at load.
func (w *encWeights) all() []arr {
	var out []arr
	for _, a := range w.arrays() {
		if !isNull(*a) {
			out = append(out, *a)
		}
	}
	for _, l := range w.linears() {
		for _, a := range []arr{l.w, l.wT, l.bias} {
			if !isNull(a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// loadEncoder loads an encoder checkpoint whose config readConfig read.
func (e *Engine) loadEncoder(ctx context.Context, spec engine.ModelSpec, cfg *modelConfig, pc engine.PoolingConfig, man map[string]tensorInfo, files []string) (engine.Model, error) {
	mods, err := planEncoder(cfg, man)
	if err != nil {
		return nil, err
	}
	m := &encModel{eng: e, cfg: cfg, seqs: map[engine.SeqID]*seqState{}}
	if err := m.size(spec, weightBytes(man), pc); err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, md := range mods {
		want[md.Name+".weight"], want[md.Name+".bias"] = true, true
	}
	var lerr error
	err = e.run(func(g *graph) {
		ts, err := loadTensors(ctx, g, files, want)
		if err != nil {
			lerr = err
			return
		}
		if m.w, lerr = buildEncoder(g, cfg, mods, ts); lerr != nil {
			return
		}
		if err := ctx.Err(); err != nil {
			m.w.free()
			lerr = err
			return
		}
		e.models[m] = struct{}{}
	})
	if err == nil {
		err = lerr
	}
	if err != nil {
		return nil, err
	}
	e.opts.logger.Info("mlx: loaded", "model", spec.ID, "path", spec.Path, "layers", cfg.Layers, "encoder", cfg.Arch)
	return m, nil
}

// size fills the encoder's Info. ContextLength is max_position_embeddings,
// capped by the checkpoint's max_seq_length (sentence-transformers
// truncates inputs there; an encoder refuses longer ones instead) and by
// spec.ContextLength. KVCapacity is the tokens one step may carry, as the
// worker protocol reports it for encoders: spec.KVCapacity, or what the
// activations of MaxBatch inputs of ContextLength need, within the memory
// the weights leave (the KV fraction of it).
func (m *encModel) size(spec engine.ModelSpec, wbytes uint64, pc engine.PoolingConfig) error {
	c := m.cfg
	ctxLen := c.ContextLength
	for _, n := range []int{spec.ContextLength, pc.MaxLength} {
		if n > 0 && n < ctxLen {
			ctxLen = n
		}
	}
	maxBatch := spec.MaxBatch
	if maxBatch == 0 {
		maxBatch = m.eng.opts.maxBatch
	}
	limit, err := metal.MemoryLimit()
	if err != nil {
		return err
	}
	if wbytes >= limit {
		return fmt.Errorf("mlx: %s: weights take %d bytes, MLX's memory limit is %d: %w", spec.ID, wbytes, limit, engine.ErrOutOfMemory)
	}
	// A token's float32 activations in one layer: the residual, q/k/v,
	// the attention output, the MLP's input and output, and its row of
	// attention scores.
	perToken := 4 * uint64(8*c.Hidden+3*c.Intermediate+c.Heads*ctxLen)
	budget := uint64(float64(limit-wbytes) * m.eng.opts.kvFraction)
	steps := spec.KVCapacity
	if steps == 0 {
		steps = int(min(budget/perToken, uint64(maxBatch*ctxLen)))
	}
	if steps < ctxLen {
		return fmt.Errorf("mlx: %s: no memory left for one input of %d tokens: %w", spec.ID, ctxLen, engine.ErrOutOfMemory)
	}
	m.info = engine.Info{ID: spec.ID, Engine: "mlx", ContextLength: ctxLen, VocabSize: c.Vocab, BOS: c.BOS,
		KVCapacity: steps, MaxBatch: maxBatch, WeightBytes: int64(wbytes), Encoder: true}
	setPooling(&m.info, c.Hidden, pc)
	return nil
}

// buildEncoder assembles the encoder from loaded tensors (taking
// ownership of them) and evaluates it.
func buildEncoder(g *graph, c *modelConfig, mods []module, ts map[string]arr) (*encWeights, error) {
	b := &builder{g: g, c: c, ts: ts, mods: map[string]module{}}
	for _, md := range mods {
		b.mods[md.Name] = md
	}
	p := c.Enc.Prefix
	ln := func(name string) lnorm { return lnorm{w: b.take(p + name + ".weight"), b: b.take(p + name + ".bias")} }
	w := &encWeights{layers: make([]encLayer, c.Layers)}
	if c.Arch == archBERT {
		w.embed = b.lin(p + "embeddings.word_embeddings")
		w.pos = b.take(p + "embeddings.position_embeddings.weight")
		typ := b.take(p + "embeddings.token_type_embeddings.weight")
		w.typ0 = g.keep(g.reshape(g.slice(typ, []int{0, 0}, []int{1, c.Hidden}), c.Hidden))
		free(&typ)
		w.embNorm = ln("embeddings.LayerNorm")
		for i := range w.layers {
			l := &w.layers[i]
			at := "encoder.layer." + itoa(i) + "."
			q, k, v := b.lin(p+at+"attention.self.query"), b.lin(p+at+"attention.self.key"), b.lin(p+at+"attention.self.value")
			var ok bool
			if l.qkv, ok = fuse(g, &q, &k, &v); !ok && g.err == nil {
				q.free()
				k.free()
				v.free()
				g.err = fmt.Errorf("mlx: layer %d: query, key and value cannot be fused", i)
			}
			l.o, l.attnNorm = b.lin(p+at+"attention.output.dense"), ln(at+"attention.output.LayerNorm")
			l.up, l.down = b.lin(p+at+"intermediate.dense"), b.lin(p+at+"output.dense")
			l.mlpNorm = ln(at + "output.LayerNorm")
		}
	} else {
		w.embed, w.embNorm, w.final = b.lin(p+"embeddings.tok_embeddings"), ln("embeddings.norm"), ln("final_norm")
		for i := range w.layers {
			l := &w.layers[i]
			at := "layers." + itoa(i) + "."
			if i > 0 {
				l.attnNorm = ln(at + "attn_norm")
			}
			l.qkv, l.o = b.lin(p+at+"attn.Wqkv"), b.lin(p+at+"attn.Wo")
			l.mlpNorm, l.up, l.down = ln(at+"mlp_norm"), b.lin(p+at+"mlp.Wi"), b.lin(p+at+"mlp.Wo")
		}
	}
	for _, a := range ts { // not part of the encoder (pooler, task heads)
		free(&a)
	}
	w.dtype = C.mlx_array_dtype(w.embed.w)
	g.eval(w.all()...)
	if g.err != nil {
		w.free()
		return nil, g.err
	}
	return w, nil
}

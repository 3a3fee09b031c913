//go:build mlx

package mlx

/*
#include "mlx/c/mlx.h"
*/
import "C"

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync/atomic"

	"github.com/mlxserving/mlxserving/engine"
)

// encModel is a loaded encoder (bert.go): it only embeds. Each input
// comes whole in one Step and attends over itself alone, both ways; no
// KV outlives the step. Its state is touched only on the engine's MLX
// thread.
type encModel struct {
	eng    *Engine
	cfg    *modelConfig
	info   engine.Info
	w      *encWeights
	seqs   map[engine.SeqID]*seqState
	closed atomic.Bool
}

var (
	_ engine.Model    = (*encModel)(nil)
	_ engine.Embedder = (*encModel)(nil)
)

// Info describes the model.
func (m *encModel) Info() engine.Info { return m.info }

// call runs job on the MLX thread, or returns ErrClosed.
func (m *encModel) call(job func(*graph) error) error { return m.eng.runOpen(&m.closed, job) }

// Open refuses: an encoder cannot generate (engine.Info.Encoder).
func (m *encModel) Open(ctx context.Context, id engine.SeqID, prompt []int32, prefixKey string) (int, error) {
	if m.closed.Load() {
		return 0, engine.ErrClosed
	}
	return 0, &engine.InvalidParamError{Param: "model", Reason: fmt.Sprintf("%s is an encoder (%s): it only embeds", m.info.ID, m.cfg.Arch)}
}

// OpenPooled starts an embedding sequence; see engine.Embedder.
func (m *encModel) OpenPooled(ctx context.Context, id engine.SeqID, input []int32, pool engine.Pooling) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkPooled(&m.info, input, pool); err != nil {
		return err
	}
	return m.call(func(*graph) error {
		if _, dup := m.seqs[id]; dup {
			return &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d is already open", id)}
		}
		m.seqs[id] = &seqState{embed: &embedState{pool: pool, input: slices.Clone(input)}}
		return nil
	})
}

// Free releases a sequence; nothing is saved.
func (m *encModel) Free(id engine.SeqID, saveKey string) {
	_ = m.call(func(*graph) error {
		delete(m.seqs, id)
		return nil
	})
}

// Close unloads the model; see engine.Model.
func (m *encModel) Close() error {
	err := m.call(func(*graph) error {
		m.unload()
		delete(m.eng.models, m)
		return nil
	})
	if err == engine.ErrClosed {
		return nil
	}
	return err
}

// unload frees the weights. MLX thread only.
func (m *encModel) unload() {
	if m.closed.Swap(true) {
		return
	}
	m.seqs = nil
	m.w.free()
}

// Step embeds every input of the batch, each whole, in one forward pass;
// see engine.Model and engine.Embedder.
func (m *encModel) Step(ctx context.Context, batch []engine.StepInput) ([]engine.StepOutput, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(batch) == 0 {
		return nil, nil
	}
	if len(batch) > m.info.MaxBatch {
		return nil, &engine.InvalidParamError{Param: "batch", Reason: fmt.Sprintf("%d inputs; the model takes at most %d", len(batch), m.info.MaxBatch)}
	}
	total := 0
	for _, in := range batch {
		total += len(in.Tokens)
	}
	if total > m.info.KVCapacity { // what one step's activations were sized for
		return nil, fmt.Errorf("mlx: %s: a step of %d tokens; the encoder takes at most %d (Info.KVCapacity): %w",
			m.info.ID, total, m.info.KVCapacity, engine.ErrOutOfMemory)
	}
	var out []engine.StepOutput
	err := m.call(func(g *graph) error {
		feeds := make([]feed, len(batch))
		seen := make(map[engine.SeqID]bool, len(batch))
		for i, in := range batch {
			s, ok := m.seqs[in.Seq]
			if !ok {
				return &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d is not open", in.Seq)}
			}
			if seen[in.Seq] {
				return &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d appears twice in the batch", in.Seq)}
			}
			seen[in.Seq] = true
			feeds[i] = feed{id: in.Seq, seq: s, tokens: in.Tokens, sample: in.Sample}
			if err := embedFeed(&feeds[i], true); err != nil {
				return err
			}
		}
		pooled, pp := m.forward(g, feeds)
		if err := ctx.Err(); err != nil {
			return err
		}
		g.eval(pooled)
		if err := cmp.Or(g.err, ctx.Err()); err != nil {
			return err
		}
		vals, err := readFloat32s(pooled)
		if err != nil {
			return err
		}
		if err := pp.addPooled(feeds, vals, m.cfg.Hidden); err != nil {
			return err
		}
		for _, f := range feeds {
			f.seq.tokens = f.tokens
		}
		out = stepOutputs(feeds, nil)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// encGroup is inputs of the same length t, which attend in one call: the
// packed tokens of their rows (q; null for one input, which starts at
// row), and on local layers, when an input is longer than the reach, the
// band mask [t, t].
type encGroup struct {
	feeds, t, row int
	q, local      arr
}

// layout groups the feeds by length and returns the groups and the
// permutation from their outputs back to packed order (null when the
// same).
func (m *encModel) layout(g *graph, feeds []feed, start []int) ([]*encGroup, arr) {
	var groups []*encGroup
	var idx [][]int32
	for i, f := range feeds {
		t := len(f.tokens)
		j := slices.IndexFunc(groups, func(x *encGroup) bool { return x.t == t })
		if j < 0 {
			j = len(groups)
			groups = append(groups, &encGroup{t: t, row: start[i]})
			idx = append(idx, nil)
		}
		groups[j].feeds++
		for k := range t {
			idx[j] = append(idx[j], int32(start[i]+k))
		}
	}
	var order []int32
	reach := m.cfg.Enc.Window / 2
	for j, grp := range groups {
		order = append(order, idx[j]...)
		if grp.feeds > 1 {
			grp.q = g.int32s(idx[j], len(idx[j]))
		}
		if m.cfg.Arch == archModernBERT && grp.t-1 > reach {
			grp.local = localMask(g, grp.t, reach)
		}
	}
	same := true
	for i, t := range order {
		same = same && int(t) == i
	}
	if same {
		return groups, arr{}
	}
	perm := make([]int32, len(order))
	for i, t := range order {
		perm[t] = int32(i)
	}
	return groups, g.int32s(perm, len(perm))
}

// localMask is [t, t] booleans: query i attends key j iff |i-j| <= reach.
func localMask(g *graph, t, reach int) arr {
	pos := make([]int32, t)
	for i := range pos {
		pos[i] = int32(i)
	}
	lo, hi := make([]int32, t), make([]int32, t)
	for i := range pos {
		lo[i], hi[i] = int32(i-reach), int32(i+reach)
	}
	k := g.int32s(pos, 1, t)
	return g.and(g.greaterEqual(k, g.int32s(lo, t, 1)), g.greaterEqual(g.int32s(hi, t, 1), k))
}

// forward runs the encoder over every feed's whole input and returns
// the pooled sums of the rows planPool picks from the last hidden state.
func (m *encModel) forward(g *graph, feeds []feed) (arr, *poolPlan) {
	c, w := m.cfg, m.w
	var ids, pos []int32
	start := make([]int, len(feeds))
	for i, f := range feeds {
		start[i] = len(ids)
		ids = append(ids, f.tokens...)
		for j := range f.tokens {
			pos = append(pos, int32(j))
		}
	}
	n, bert := len(ids), c.Arch == archBERT
	pp := planPool(feeds, start)
	positions := g.int32s(pos, n)
	groups, perm := m.layout(g, feeds, start)
	eps := c.Enc.LNEps
	x := w.embed.rows(g, g.int32s(ids, n)) // [N, hidden]
	if bert {
		x = g.add(g.add(x, g.take(w.pos, positions, 0)), w.typ0)
	}
	x = g.layerNorm(x, w.embNorm, eps)
	for li := range w.layers {
		l := &w.layers[li]
		if bert {
			a := l.o.apply(g, m.attention(g, li, n, l.qkv.apply(g, x), positions, groups, perm))
			x = g.layerNorm(g.add(x, a), l.attnNorm, eps)
			f := l.down.apply(g, geluErf(g, l.up.apply(g, x)))
			x = g.layerNorm(g.add(x, f), l.mlpNorm, eps)
			continue
		}
		h := x
		if !isNull(l.attnNorm.w) {
			h = g.layerNorm(x, l.attnNorm, eps)
		}
		x = g.add(x, l.o.apply(g, m.attention(g, li, n, l.qkv.apply(g, h), positions, groups, perm)))
		y := l.up.apply(g, g.layerNorm(x, l.mlpNorm, eps))
		in := g.slice(y, []int{0, 0}, []int{n, c.Intermediate})
		gate := g.slice(y, []int{0, c.Intermediate}, []int{n, 2 * c.Intermediate})
		x = g.add(x, l.down.apply(g, g.mul(geluErf(g, in), gate)))
	}
	rows := g.take(x, g.int32s(pp.idx, len(pp.idx)), 0)
	if !bert {
		rows = g.layerNorm(rows, w.final, eps)
	}
	return pp.pool(g, rows, c.Hidden), pp
}

// attention is layer li's bidirectional self-attention from the q/k/v
// product qkv [n, 3*hidden] (queries, keys, values side by side, each
// head's D values together), each input over itself alone; ModernBERT
// rotates queries and keys first, with its local or global base, and
// its local layers see only keys within Window/2 positions. It returns
// [N, hidden] in packed order, before the output projection.
func (m *encModel) attention(g *graph, li, n int, qkv, positions arr, groups []*encGroup, perm arr) arr {
	c := m.cfg
	hd, d := c.Hidden, c.HeadDim
	part := func(i int) arr { // [N, heads, 1, D]
		return g.reshape(g.slice(qkv, []int{0, i * hd}, []int{n, (i + 1) * hd}), n, c.Heads, 1, d)
	}
	q, k, v := part(0), part(1), part(2)
	local := c.Arch == archModernBERT && c.Enc.Local[li]
	if c.Arch == archModernBERT {
		theta := c.Enc.GlobalTheta
		if local {
			theta = c.Enc.LocalTheta
		}
		q, k = g.ropeAt(q, d, theta, 1, positions, arr{}), g.ropeAt(k, d, theta, 1, positions, arr{})
	}
	scale := float32(1 / math.Sqrt(float64(d)))
	outs := make([]arr, len(groups))
	for j, grp := range groups {
		pick := func(a arr) arr { // [G, heads, t, D]
			if isNull(grp.q) {
				a = g.slice(a, []int{grp.row, 0, 0, 0}, []int{grp.row + grp.t, c.Heads, 1, d})
			} else {
				a = g.take(a, grp.q, 0)
			}
			return g.transpose(g.reshape(a, grp.feeds, grp.t, c.Heads, d), 0, 2, 1, 3)
		}
		var o arr
		if local && !isNull(grp.local) {
			o = g.sdpaMask(pick(q), pick(k), pick(v), scale, grp.local, arr{})
		} else {
			o = g.sdpa(pick(q), pick(k), pick(v), scale, false, arr{})
		}
		outs[j] = g.reshape(g.transpose(o, 0, 2, 1, 3), grp.feeds*grp.t, hd)
	}
	o := g.concat(0, outs...)
	if !isNull(perm) {
		o = g.take(o, perm, 0)
	}
	return o
}

// layerNorm is MLX's fast layer_norm over the last axis with n's weight
// and bias (either may be null).
func (g *graph) layerNorm(x arr, n lnorm, eps float32) arr {
	return g.op("layer_norm", func(r *arr) C.int { return C.mlx_fast_layer_norm(r, x, n.w, n.b, C.float(eps), g.s) })
}

// geluErf is the exact GELU (transformers' "gelu"), computed in float32:
// x/2 * (1 + erf(x/sqrt(2))).
func geluErf(g *graph, x arr) arr {
	dt := dtype(x)
	f := x
	if dt != C.MLX_FLOAT32 {
		f = g.astype(x, C.MLX_FLOAT32)
	}
	z := g.mul(f, g.scalar(float32(1/math.Sqrt2)))
	e := g.op("erf", func(r *arr) C.int { return C.mlx_erf(r, z, g.s) })
	y := g.mul(g.mul(f, g.scalar(0.5)), g.add(g.scalar(1), e))
	if dt != C.MLX_FLOAT32 {
		y = g.astype(y, dt)
	}
	return y
}

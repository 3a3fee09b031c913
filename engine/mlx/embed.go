//go:build mlx

package mlx

/*
#include "mlx/c/mlx.h"
*/
import "C"

import (
	"context"
	"fmt"
	"slices"

	"github.com/mlxserving/mlxserving/engine"
)

var _ engine.Embedder = (*model)(nil)

// embedState is an embedding sequence's (engine.Embedder) input and what
// it has pooled so far.
type embedState struct {
	pool  engine.Pooling
	input []int32
	// sum is the running pooled vector in float32: the sum of every fed
	// token's hidden state (mean), or the one row cls or lasttoken keeps.
	sum  []float32
	done bool // the input ended and its vector was returned
}

// vector is the pooled vector once the whole input was fed.
func (e *embedState) vector() []float32 {
	out := slices.Clone(e.sum)
	if e.pool == engine.PoolMean {
		n := float32(len(e.input))
		for i := range out {
			out[i] /= n
		}
	}
	return out
}

// setPooling fills what Info says about the model's embeddings: every
// model pools its hidden states of hidden values, as its checkpoint's
// sentence-transformers configuration says (engine.ReadPooling).
func setPooling(info *engine.Info, hidden int, pc engine.PoolingConfig) {
	info.EmbedDim, info.Pooling, info.Normalize = hidden, pc.Pooling, pc.Normalize
	info.Matryoshka, info.MatryoshkaDims = pc.Matryoshka, pc.MatryoshkaDims
}

// checkPooled checks OpenPooled's arguments against the model.
func checkPooled(info *engine.Info, input []int32, pool engine.Pooling) error {
	switch pool {
	case engine.PoolMean, engine.PoolCLS, engine.PoolLast:
	default:
		return &engine.InvalidParamError{Param: "pooling", Reason: fmt.Sprintf("%v: want mean, cls or lasttoken", pool)}
	}
	if len(input) == 0 {
		return &engine.InvalidParamError{Param: "input", Reason: "empty"}
	}
	if len(input) > info.ContextLength {
		return &engine.ContextLengthError{Model: info.ID, Prompt: len(input), Limit: info.ContextLength}
	}
	for _, t := range input {
		if t < 0 || int(t) >= info.VocabSize {
			return &engine.InvalidParamError{Param: "input", Reason: fmt.Sprintf("token %d is outside the vocabulary [0, %d)", t, info.VocabSize)}
		}
	}
	return nil
}

// OpenPooled starts an embedding sequence; see engine.Embedder. It takes
// no saved prefix: pooling reads every token's hidden state.
func (m *model) OpenPooled(ctx context.Context, id engine.SeqID, input []int32, pool engine.Pooling) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkPooled(&m.info, input, pool); err != nil {
		return err
	}
	return m.call(func(g *graph) error {
		if _, dup := m.seqs[id]; dup {
			return &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d is already open", id)}
		}
		m.relieve()
		m.seqs[id] = &seqState{embed: &embedState{pool: pool, input: slices.Clone(input)}}
		return g.err
	})
}

// embedFeed checks an embedding sequence's step input against the input
// it was opened with and marks the feed that ends it. whole asks that the
// input come in one step (an encoder's).
func embedFeed(f *feed, whole bool) error {
	e, s := f.seq.embed, f.seq
	if e.done {
		return &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("embedding sequence %d has returned its vector; free it", f.id)}
	}
	at, n := len(s.tokens), len(s.tokens)+len(f.tokens)
	ends := f.sample
	f.sample, f.ends = false, ends
	switch {
	case whole && (at != 0 || n != len(e.input) || !ends):
		return &engine.InvalidParamError{Param: "tokens", Reason: fmt.Sprintf(
			"sequence %d embeds on an encoder: its whole input (%d tokens) comes in one step with Sample set; this step feeds tokens %d to %d, Sample %v",
			f.id, len(e.input), at, n, ends)}
	case n > len(e.input) || ends != (n == len(e.input)):
		return &engine.InvalidParamError{Param: "tokens", Reason: fmt.Sprintf(
			"embedding sequence %d: its input is %d tokens and Sample marks the step that ends it; this step feeds tokens %d to %d, Sample %v",
			f.id, len(e.input), at, n, ends)}
	case !slices.Equal(f.tokens, e.input[at:n]):
		return &engine.InvalidParamError{Param: "tokens", Reason: fmt.Sprintf("embedding sequence %d: the tokens fed differ from the input it was opened with", f.id)}
	}
	return nil
}

// poolPlan is which hidden-state rows a step pools: the packed token of
// each row and the contributing feed it adds to (an index into who).
type poolPlan struct {
	idx, seg []int32
	who      []int // feed index of each contributor
}

// planPool lists the rows each embedding feed pools this step: every
// token for mean, the first token of the input for cls, its last for
// lasttoken; start is each feed's first packed token.
func planPool(feeds []feed, start []int) *poolPlan {
	var p poolPlan
	for i, f := range feeds {
		e := f.seq.embed
		if e == nil {
			continue
		}
		from, to := start[i], start[i]+len(f.tokens)
		switch {
		case e.pool == engine.PoolMean:
		case e.pool == engine.PoolCLS && len(f.seq.tokens) == 0:
			to = from + 1
		case e.pool == engine.PoolLast && f.ends:
			from = to - 1
		default:
			continue
		}
		for t := from; t < to; t++ {
			p.idx = append(p.idx, int32(t))
			p.seg = append(p.seg, int32(len(p.who)))
		}
		p.who = append(p.who, i)
	}
	if len(p.who) == 0 {
		return nil
	}
	return &p
}

// pool sums rows [M, hidden] (the last hidden state at pp.idx) per
// contributor in float32: [len(pp.who), hidden].
func (pp *poolPlan) pool(g *graph, rows arr, hidden int) arr {
	m := len(pp.idx)
	if dtype(rows) != C.MLX_FLOAT32 {
		rows = g.astype(rows, C.MLX_FLOAT32)
	}
	upd := g.reshape(rows, m, 1, hidden)
	return g.scatterAdd(g.zeros(C.MLX_FLOAT32, len(pp.who), hidden), g.int32s(pp.seg, m), upd)
}

// addPooled adds a step's pooled sums [len(pp.who)*hidden] to the
// contributors' vectors.
func (pp *poolPlan) addPooled(feeds []feed, vals []float32, hidden int) error {
	if len(vals) != len(pp.who)*hidden {
		return fmt.Errorf("mlx: pooled %d values for %d vectors of %d", len(vals), len(pp.who), hidden)
	}
	for c, i := range pp.who {
		e := feeds[i].seq.embed
		row := vals[c*hidden : (c+1)*hidden]
		if e.sum == nil {
			e.sum = slices.Clone(row)
			continue
		}
		for j, v := range row {
			e.sum[j] += v
		}
	}
	return nil
}

// stepOutputs is one output per feed that samples or ends an embedding
// input, in feed order: sampled tokens come from sampled(i), the i-th
// sampling feed's output (its Seq set here).
func stepOutputs(feeds []feed, sampled func(i int) engine.StepOutput) []engine.StepOutput {
	var out []engine.StepOutput
	i := 0
	for _, f := range feeds {
		switch {
		case f.ends:
			f.seq.embed.done = true
			out = append(out, engine.StepOutput{Seq: f.id, Token: -1, Embedding: f.seq.embed.vector()})
		case f.sample:
			o := sampled(i)
			o.Seq = f.id
			out = append(out, o)
			i++
		}
	}
	return out
}

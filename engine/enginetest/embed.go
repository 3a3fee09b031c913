package enginetest

import (
	"context"
	"fmt"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/mix"
)

// The simulated hidden state of a token is a pseudo-random vector of the
// history hash after it (a causal model's hidden state depends on the
// tokens up to it) or, on an encoder, of the whole input's hash and the
// token's position (every token sees every other). Pooling follows the
// contract exactly, so chunked equals whole and batched equals alone.

const hiddenSalt = 0xd6e8feb86659fd93

// hidden writes the simulated hidden state of hash h into v.
func hidden(v []float64, h uint64) {
	for j := range v {
		x := mix.Mix64(h ^ mix.Mix64(uint64(j)+hiddenSalt))
		v[j] = float64(int64(x>>11)-(1<<52)) / (1 << 52) // in [-1, 1)
	}
}

// OpenPooled starts embedding sequence id for input: it reuses nothing
// and is never saved.
func (m *simModel) OpenPooled(ctx context.Context, id engine.SeqID, input []int32, pool engine.Pooling) error {
	if m.info.EmbedDim == 0 {
		return &engine.InvalidParamError{Param: "model", Reason: fmt.Sprintf("model %q does not embed", m.info.ID)}
	}
	switch pool {
	case engine.PoolMean, engine.PoolCLS, engine.PoolLast:
	default:
		return &engine.InvalidParamError{Param: "pooling", Reason: fmt.Sprintf("%v is not a pooling", pool)}
	}
	if _, err := m.open(ctx, id, input, "", false); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if seq := m.seqs[id]; seq != nil {
		seq.pool = pool
		seq.sum = make([]float64, m.info.EmbedDim)
	}
	return nil
}

// checkPooled validates an input of embedding sequence seq. Has to be
// called with m.mu held.
func (m *simModel) checkPooled(seq *simSeq, in *engine.StepInput) error {
	if m.info.Encoder && (len(seq.tokens) > 0 || !in.Sample) {
		return &engine.InvalidParamError{Param: "tokens",
			Reason: fmt.Sprintf("sequence %d: an encoder's input comes whole, in one step that pools it", in.Seq)}
	}
	return nil
}

// pool feeds tokens to embedding sequence seq, accumulating its hidden
// states, and returns its vector when last is set. Has to be called with
// m.mu held, before seq.hash takes the tokens.
func (m *simModel) pool(seq *simSeq, tokens []int32, last bool) []float32 {
	v := make([]float64, len(seq.sum))
	take := func(h uint64) {
		hidden(v, h)
		switch {
		case seq.pool == engine.PoolMean:
			for j := range v {
				seq.sum[j] += v[j]
			}
		case seq.pool == engine.PoolLast, seq.pooled == 0: // PoolCLS keeps the first
			copy(seq.sum, v)
		}
		seq.pooled++
	}
	if m.info.Encoder {
		whole := feed(hashStart, tokens)
		for i := range tokens {
			take(mix.Mix64(whole ^ mix.Mix64(uint64(i)+posSalt)))
		}
	} else {
		h := seq.hash
		for _, t := range tokens {
			h = feed(h, []int32{t})
			take(h)
		}
	}
	if !last {
		return nil
	}
	out := make([]float32, len(seq.sum))
	n := 1.0
	if seq.pool == engine.PoolMean {
		n = float64(seq.pooled)
	}
	for j := range out {
		out[j] = float32(seq.sum[j] / n)
	}
	return out
}

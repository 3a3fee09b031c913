//go:build mlx

package mlx

/*
#include "mlx/c/mlx.h"
*/
import "C"

import (
	"math"
	"math/rand/v2"

	"github.com/mlxserving/mlxserving/engine"
)

// sampleAll picks the next token of every sampling feed from logits
// [S, vocab] on the device. It returns int32 tokens [S] and float32
// log-probabilities [S] (zero where not asked for) and, when any feed
// asks for top log-probabilities, the K most likely ids [S, K] and their
// log-probabilities (K the largest TopLogprobs asked; null arrays
// otherwise).
func (m *model) sampleAll(g *graph, logits arr, feeds []feed, params []*engine.SamplingParams) (tokens, logprobs, topIDs, topLps arr) {
	simple := true
	k := 0
	i := 0
	for _, f := range feeds {
		if !f.sample {
			continue
		}
		p := params[i]
		if !p.Greedy() || p.Logprobs || penalty(p) || p.Adjusts() || f.allowed != nil || p.TopLogprobs > 0 {
			simple = false
		}
		k = max(k, p.TopLogprobs)
		i++
	}
	n := len(params)
	if simple {
		return g.astype(g.argmax(logits, -1), C.MLX_INT32), g.zeros(C.MLX_FLOAT32, n), topIDs, topLps
	}
	k = min(k, m.cfg.Vocab)
	toks, lps := make([]arr, n), make([]arr, n)
	var tids, tlps []arr
	i = 0
	for _, f := range feeds {
		if !f.sample {
			continue
		}
		row := g.slice(logits, []int{i, 0}, []int{i + 1, m.cfg.Vocab})
		row = m.adjust(g, row, f, params[i])
		toks[i], lps[i] = m.sampleRow(g, row, f.seq, params[i])
		if k > 0 {
			lp := g.sub(row, g.logsumexp(row, -1))
			ids := g.slice(g.argsort(g.neg(lp), -1), []int{0, 0}, []int{1, k})
			tids = append(tids, g.astype(ids, C.MLX_INT32))
			tlps = append(tlps, g.takeAlong(lp, ids, -1))
		}
		i++
	}
	if k > 0 {
		topIDs, topLps = g.concat(0, tids...), g.concat(0, tlps...)
	}
	return g.concat(0, toks...), g.concat(0, lps...), topIDs, topLps
}

// adjust applies the repetition penalty, presence and frequency
// penalties, logit bias and the feed's allowed mask to row [1, vocab], in
// the engine contract's order. The additive part is built on the host.
func (m *model) adjust(g *graph, row arr, f feed, p *engine.SamplingParams) arr {
	if penalty(p) {
		row = m.penalize(g, row, f.seq, p.RepetitionPenalty)
	}
	if !p.Adjusts() && f.allowed == nil {
		return row
	}
	v := m.cfg.Vocab
	add := make([]float32, v)
	if p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
		for t, c := range f.seq.counts {
			if t >= 0 && int(t) < v {
				add[t] -= p.PresencePenalty + float32(c)*p.FrequencyPenalty
			}
		}
	}
	for t, b := range p.LogitBias {
		if t >= 0 && int(t) < v {
			add[t] += b
		}
	}
	if f.allowed != nil {
		ninf := float32(math.Inf(-1))
		for t := 0; t < v; t++ {
			if !engine.MaskAllows(f.allowed, int32(t)) {
				add[t] = ninf
			}
		}
	}
	return g.add(row, g.float32s(add, 1, v))
}

func penalty(p *engine.SamplingParams) bool {
	return p.RepetitionPenalty != 0 && p.RepetitionPenalty != 1
}

// sampleRow samples one token from the adjusted row [1, vocab] with p:
// temperature, top-k, top-p and min-p over the sorted distribution, then
// a categorical draw with the sequence's key.
func (m *model) sampleRow(g *graph, row arr, s *seqState, p *engine.SamplingParams) (tok, lp arr) {
	if p.Greedy() {
		tok = g.astype(g.argmax(row, -1), C.MLX_INT32)
	} else {
		tok = m.draw(g, row, s, p)
	}
	if !p.Logprobs && p.TopLogprobs == 0 {
		return tok, g.zeros(C.MLX_FLOAT32, 1)
	}
	picked := g.takeAlong(row, g.reshape(tok, 1, 1), -1)
	return tok, g.reshape(g.sub(picked, g.logsumexp(row, -1)), 1)
}

// penalize divides positive logits (multiplies negative ones) of every
// token the sequence holds by rp.
func (m *model) penalize(g *graph, row arr, s *seqState, rp float32) arr {
	seen := map[int32]bool{}
	var ids []int32
	for _, t := range s.tokens {
		if !seen[t] && t >= 0 && int(t) < m.cfg.Vocab {
			seen[t] = true
			ids = append(ids, t)
		}
	}
	if len(ids) == 0 {
		return row
	}
	idx := g.int32s(ids, 1, len(ids))
	vals := g.takeAlong(row, idx, -1)
	r := g.scalar(rp)
	pen := g.where(g.greater(vals, g.scalar(0)), g.div(vals, r), g.mul(vals, r))
	return g.putAlong(row, idx, pen, -1)
}

// draw samples with temperature, top-k, top-p and min-p.
func (m *model) draw(g *graph, row arr, s *seqState, p *engine.SamplingParams) arr {
	v := m.cfg.Vocab
	l := row
	if p.Temperature != 1 {
		l = g.div(row, g.scalar(p.Temperature))
	}
	order := g.argsort(g.neg(l), -1)
	sl := g.takeAlong(l, order, -1)
	ninf := g.scalar(float32(math.Inf(-1)))
	if p.TopK > 0 && p.TopK < v {
		sl = g.where(g.less(g.arange(v, C.MLX_INT32), g.scalar(float32(p.TopK))), sl, ninf)
	}
	if p.TopP > 0 && p.TopP < 1 {
		before := g.cumsum(g.softmax(sl, -1), -1, false)
		sl = g.where(g.less(before, g.scalar(p.TopP)), sl, ninf)
	}
	if p.MinP > 0 {
		probs := g.softmax(sl, -1)
		floor := g.mul(g.slice(probs, []int{0, 0}, []int{1, 1}), g.scalar(p.MinP))
		sl = g.where(g.less(probs, floor), ninf, sl)
	}
	if isNull(s.key) {
		seed := rand.Uint64()
		if p.HasSeed {
			seed = p.Seed
		}
		s.key = g.keep(g.randomKey(seed))
	}
	next, use := g.split(s.key)
	m.replace(g, &s.key, next)
	j := g.astype(g.categorical(sl, use), C.MLX_INT32)
	return g.astype(g.reshape(g.takeAlong(order, g.reshape(j, 1, 1), -1), 1), C.MLX_INT32)
}

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
	"github.com/mlxserving/mlxserving/internal/mix"
)

// topPSteps is the number of bisection steps that find a row's top-p
// threshold: probabilities are non-negative float32s at most 1, whose bit
// patterns order like the numbers and lie below 2^30, so 31 halvings
// land on the exact probability of the last token kept.
const topPSteps = 31

// sampleAll picks the next token of every sampling feed from logits
// [S, vocab], the whole batch in one set of device ops: penalties, logit
// bias and allowed-token masks go up as sparse updates or bit masks,
// top-k takes a threshold from the K largest, top-p takes one from those
// K sorted (or, when a top-p row has no top-k, bisects the probabilities
// for it: 31 masked sums, no vocabulary sort), min-p is a threshold on the logits, and the draw adds Gumbel
// noise that depends only on the sequence's seed and how many tokens it
// has generated (sampled or forced), so a sequence draws the same tokens
// alone or in any batch.
// It returns int32 tokens [S] (uint32 for all-greedy feeds without
// log-probabilities, which skip the cast) and float32 log-probabilities [S] (zero
// where not asked for) and, when any feed asks for top log-probabilities,
// the K most likely ids [S, K] and their log-probabilities (K the largest
// TopLogprobs asked; null arrays otherwise).
func (m *model) sampleAll(g *graph, logits arr, feeds []feed, params []*engine.SamplingParams) (tokens, logprobs, topIDs, topLps arr) {
	n, v := len(params), m.cfg.Vocab
	simple, k := true, 0
	var sf []feed
	for _, f := range feeds {
		if !f.sample {
			continue
		}
		p := params[len(sf)]
		sf = append(sf, f)
		if !p.Greedy() || p.Logprobs || penalty(p) || p.Adjusts() || f.allowed != nil || p.TopLogprobs > 0 {
			simple = false
		}
		k = max(k, p.TopLogprobs)
	}
	if simple { // argmax's uint32 tokens and host zeros: one primitive
		return g.argmax(logits, -1), g.float32s(make([]float32, n), n), topIDs, topLps
	}
	row := m.adjust(g, logits, sf, params)
	greedyTok := g.astype(g.argmax(row, -1), C.MLX_INT32)
	tokens = greedyTok
	greedy := make([]bool, n)
	all := true
	for i, p := range params {
		greedy[i] = p.Greedy()
		all = all && greedy[i]
	}
	if !all {
		tokens = g.where(g.bools(greedy, n), greedyTok, m.draw(g, row, sf, params))
	}
	logprobs = g.zeros(C.MLX_FLOAT32, n)
	asked := make([]bool, n)
	anyLP := false
	for i, p := range params {
		asked[i] = p.Logprobs || p.TopLogprobs > 0
		anyLP = anyLP || asked[i]
	}
	if !anyLP {
		return tokens, logprobs, topIDs, topLps
	}
	lp := g.sub(row, g.logsumexp(row, -1))
	picked := g.reshape(g.takeAlong(lp, g.reshape(tokens, n, 1), -1), n)
	logprobs = g.where(g.bools(asked, n), picked, logprobs)
	if k = min(k, v); k > 0 {
		ids := g.argpartition(g.neg(lp), k-1, -1)
		if k < v {
			ids = g.slice(ids, []int{0, 0}, []int{n, k})
		}
		vals := g.takeAlong(lp, ids, -1)
		order := g.argsort(g.neg(vals), -1)
		topIDs, topLps = g.astype(g.takeAlong(ids, order, -1), C.MLX_INT32), g.takeAlong(vals, order, -1)
	}
	return tokens, logprobs, topIDs, topLps
}

// adjust applies the repetition penalty, presence and frequency penalties,
// logit bias and allowed-token masks to logits [S, vocab], in the engine
// contract's order: the penalised and biased entries go up as flat
// indices with their factors or additions, the masks as bits.
func (m *model) adjust(g *graph, logits arr, sf []feed, params []*engine.SamplingParams) arr {
	n, v := len(params), m.cfg.Vocab
	var repIdx []int32
	var repBy []float32
	var addIdx []int32
	var addBy []float32
	masked := false
	for i, f := range sf {
		p := params[i]
		base := int32(i * v)
		if penalty(p) {
			seen := map[int32]bool{}
			for _, toks := range [][]int32{f.seq.tokens, f.tokens} {
				for _, t := range toks {
					if !seen[t] {
						seen[t] = true
						repIdx, repBy = append(repIdx, base+t), append(repBy, p.RepetitionPenalty)
					}
				}
			}
		}
		add := map[int32]float32{}
		if p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
			for t, c := range f.seq.counts {
				add[t] -= p.PresencePenalty + float32(c)*p.FrequencyPenalty
			}
		}
		for t, b := range p.LogitBias {
			add[t] += b
		}
		for t, a := range add {
			addIdx, addBy = append(addIdx, base+t), append(addBy, a)
		}
		masked = masked || f.allowed != nil
	}
	if len(repIdx) == 0 && len(addIdx) == 0 && !masked {
		return logits
	}
	flat := g.reshape(logits, n*v)
	if len(repIdx) > 0 {
		idx := g.int32s(repIdx, len(repIdx))
		vals := g.take(flat, idx, 0)
		r := g.float32s(repBy, len(repBy))
		pen := g.where(g.greater(vals, g.scalar(0)), g.div(vals, r), g.mul(vals, r))
		flat = g.scatter(flat, idx, g.reshape(pen, len(repIdx), 1))
	}
	if len(addIdx) > 0 {
		flat = g.scatterAdd(flat, g.int32s(addIdx, len(addIdx)), g.float32s(addBy, len(addBy), 1))
	}
	row := g.reshape(flat, n, v)
	if masked {
		row = g.where(m.allowedBits(g, sf), row, g.scalar(float32(math.Inf(-1))))
	}
	return row
}

// allowedBits expands the feeds' allowed-token masks to booleans
// [S, vocab] on the device: the host sends 32-bit words (all ones for a
// feed without a mask).
func (m *model) allowedBits(g *graph, sf []feed) arr {
	v := m.cfg.Vocab
	words := (v + 31) / 32
	w := make([]uint32, len(sf)*words)
	for i, f := range sf {
		row := w[i*words : (i+1)*words]
		for j := range row {
			if f.allowed == nil {
				row[j] = math.MaxUint32
			} else {
				row[j] = uint32(f.allowed[j/2] >> (32 * (j % 2)))
			}
		}
	}
	ids := g.astype(g.arange(v, C.MLX_INT32), C.MLX_UINT32)
	word := g.take(g.uint32s(w, len(sf), words), g.shr(ids, g.u32(5)), 1)
	bit := g.bitAnd(g.shr(word, g.bitAnd(ids, g.u32(31))), g.u32(1))
	return g.greater(bit, g.u32(0))
}

func penalty(p *engine.SamplingParams) bool {
	return p.RepetitionPenalty != 0 && p.RepetitionPenalty != 1
}

// draw samples every row of the adjusted logits [S, vocab] (greedy rows
// draw too; the caller replaces their draw by the argmax).
func (m *model) draw(g *graph, row arr, sf []feed, params []*engine.SamplingParams) arr {
	l := m.filter(g, row, params)
	return g.astype(g.argmax(g.add(l, m.gumbel(g, sf, params)), -1), C.MLX_INT32)
}

// filter applies each row's temperature, top-k, top-p and min-p to logits
// [S, vocab], setting the tokens they drop to -inf. Greedy rows get
// temperature 1 and no filters.
func (m *model) filter(g *graph, row arr, params []*engine.SamplingParams) arr {
	n, v := len(params), m.cfg.Vocab
	ninf := g.scalar(float32(math.Inf(-1)))
	temp := make([]float32, n)
	kmax := 0
	var useP, useMin bool
	topP, logMin, hasP := make([]float32, n), make([]float32, n), make([]bool, n)
	for i, p := range params {
		temp[i] = 1
		if p.Greedy() {
			continue
		}
		temp[i] = p.Temperature
		if p.TopK > 0 && p.TopK < v {
			kmax = max(kmax, p.TopK)
		}
		topP[i] = 1
		if p.TopP > 0 && p.TopP < 1 {
			topP[i], hasP[i], useP = p.TopP, true, true
		}
		logMin[i] = float32(math.Inf(-1))
		if p.MinP > 0 {
			logMin[i], useMin = float32(math.Log(float64(p.MinP))), true
		}
	}
	l := g.div(row, g.float32s(temp, n, 1))
	covered := useP // every top-p row has a top-k: its nucleus is among the top-k
	for i := range params {
		covered = covered && (!hasP[i] || params[i].TopK > 0 && params[i].TopK < v)
	}
	if kmax > 0 {
		// The k-th largest logit of each row, from its kmax largest.
		at, has := make([]int32, n), make([]bool, n)
		for i, p := range params {
			if !p.Greedy() && p.TopK > 0 && p.TopK < v {
				at[i], has[i] = int32(kmax-p.TopK), true
			}
		}
		top := g.topk(l, kmax, -1)
		th := g.takeAlong(g.sort(top, -1), g.int32s(at, n, 1), -1)
		th = g.where(g.bools(has, n, 1), th, ninf)
		l = g.where(g.less(l, th), ninf, l)
		if covered {
			// top-p over each row's top-k, sorted: keep the tokens before
			// which less than top_p is gathered.
			desc := g.neg(g.sort(g.neg(top), -1))
			desc = g.where(g.less(desc, th), ninf, desc)
			before := g.cumsum(g.softmax(desc, -1), -1, false)
			kept := g.sumKeep(g.astype(g.less(before, g.float32s(topP, n, 1)), C.MLX_INT32), -1)
			last := g.takeAlong(desc, g.sub(kept, g.int32s([]int32{1}, 1)), -1)
			l = g.where(g.and(g.bools(hasP, n, 1), g.less(l, last)), ninf, l)
		}
	}
	if useP && !covered {
		// Keep the tokens at least as likely as the least likely one of
		// the smallest set whose probability reaches top_p: the largest
		// threshold whose tokens still hold top_p, found by bisection.
		probs := g.softmax(l, -1)
		want := g.float32s(topP, n, 1)
		lo := g.zeros(C.MLX_INT32, n, 1)
		hi := g.int32s(fill(n, int32(math.Float32bits(1)+1)), n, 1)
		one := g.int32s([]int32{1}, 1)
		zero := g.scalar(0)
		for range topPSteps {
			mid := g.shr(g.add(lo, hi), one)
			mass := g.sumKeep(g.where(g.greaterEqual(probs, g.view(mid, C.MLX_FLOAT32)), probs, zero), -1)
			ok := g.greaterEqual(mass, want)
			lo, hi = g.where(ok, mid, lo), g.where(ok, hi, mid)
		}
		drop := g.and(g.bools(hasP, n, 1), g.less(probs, g.view(lo, C.MLX_FLOAT32)))
		l = g.where(drop, ninf, l)
	}
	if useMin {
		floor := g.add(g.maxKeep(l, -1), g.float32s(logMin, n, 1))
		l = g.where(g.less(l, floor), ninf, l)
	}
	return l
}

// gumbel returns Gumbel noise [S, vocab]: entry j of row i is a hash of
// (j, the key of sequence i at its current draw), so a row's noise does
// not depend on the rest of the batch. A sequence's seed is fixed at its
// first draw: the request's, or a random one.
func (m *model) gumbel(g *graph, sf []feed, params []*engine.SamplingParams) arr {
	n, v := len(sf), m.cfg.Vocab
	k0, k1 := make([]uint32, n), make([]uint32, n)
	for i, f := range sf {
		s := f.seq
		if !s.seeded && !params[i].Greedy() {
			s.seed, s.seeded = rand.Uint64(), true
			if params[i].HasSeed {
				s.seed = params[i].Seed
			}
		}
		pos := s.drawn
		if s.sampled { // tokens fed after the last sampled one were forced: generated positions
			pos += len(f.tokens) - 1
		}
		k0[i], k1[i] = drawKey(s.seed, pos)
	}
	ids := g.astype(g.arange(v, C.MLX_INT32), C.MLX_UINT32)
	return g.gumbelNoise(ids, g.uint32s(k0, n, 1), g.uint32s(k1, n, 1))
}

// drawKey is the noise key of a sequence's draw at position pos (tokens
// it has sampled before): splitmix64 of the seed and the position.
func drawKey(seed uint64, pos int) (uint32, uint32) {
	z := mix.Mix64(seed + uint64(pos+1)*0x9e3779b97f4a7c15)
	return uint32(z), uint32(z >> 32)
}

func fill(n int, v int32) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = v
	}
	return out
}

package enginetest

import (
	"math"
	"math/bits"
	"slices"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/mix"
)

// The simulated engine's "model" is a rolling hash over a sequence's token
// history. Every token fed mixes into the hash; the next token is drawn
// from the hash (and the seed when sampling), so it depends on the whole
// history and on nothing else — not on batching, chunking or prefix reuse.

const (
	hashStart  = 0x6a09e667f3bcc908
	hashPrime  = 0x100000001b3
	seedSalt   = 0x9e3779b97f4a7c15
	posSalt    = 0x2545f4914f6cdd1d
	tokenSalt  = 0xbf58476d1ce4e5b9
	eosSalt    = 0x94d049bb133111eb
	unitDenom  = 1 << 53
	logprobMax = 8.0
)

// drawSeed is the seed of the draw at generated position pos: sampling is
// a function of the seed and the position, so a sequence resumed at pos
// (engine.SamplingParams.Generated) draws as the uninterrupted one did.
func drawSeed(seed uint64, pos int) uint64 {
	return mix.Mix64(seed ^ mix.Mix64(uint64(pos)+posSalt))
}

// feed mixes tokens into the rolling hash h.
func feed(h uint64, tokens []int32) uint64 {
	for _, t := range tokens {
		h = mix.Mix64(h*hashPrime + uint64(uint32(t)) + 1)
	}
	return h
}

// picker turns a hash state into a token.
type picker struct {
	vocab   uint64
	eos     []int32
	eosProb float64
}

// draw returns the token for history hash h, mixed with seed when the
// sequence samples (sampled false means greedy), and its pseudo logprob.
func (p *picker) draw(h uint64, sampled bool, seed uint64) (int32, float32) {
	x := mix.Mix64(h ^ tokenSalt)
	if sampled {
		x = mix.Mix64(x ^ mix.Mix64(seed+seedSalt))
	}
	lp := -float32(x>>40) / float32(1<<24) * logprobMax
	if len(p.eos) > 0 && p.eosProb > 0 {
		u := float64(mix.Mix64(x^eosSalt)>>11) / unitDenom
		if u < p.eosProb {
			return p.eos[x%uint64(len(p.eos))], lp
		}
	}
	tok := int32(x % p.vocab)
	for slices.Contains(p.eos, tok) {
		tok = int32((uint64(tok) + 1) % p.vocab)
	}
	return tok, lp
}

const (
	maskSalt  = 0xd6e8feb86659fd93
	logitSalt = 0xa0761d6478bd642f
)

// adjusted is draw under an allowed-token mask, logit bias and presence
// and frequency penalties. The history's natural token (what draw picks)
// scores logprobMax; every other token a pseudo logit below it from the
// hash; bias is added and penalties subtracted, and the best allowed
// token wins. With no bias or penalty an allowed natural token is kept
// and a disallowed one is replaced by an allowed token chosen by the
// hash, so a mask alone costs O(vocab/64).
func (p *picker) adjusted(h uint64, sampled bool, seed uint64, sp *engine.SamplingParams, allowed []uint64, gen map[int32]int) (int32, float32) {
	tok, lp := p.draw(h, sampled, seed)
	x := mix.Mix64(h ^ tokenSalt ^ mix.Mix64(seed+maskSalt))
	if !sp.Adjusts() {
		if engine.MaskAllows(allowed, tok) {
			return tok, lp
		}
		// A disallowed EOS draw falls back to the token it replaced.
		if slices.Contains(p.eos, tok) {
			if t, l := (&picker{vocab: p.vocab, eos: p.eos}).draw(h, sampled, seed); engine.MaskAllows(allowed, t) {
				return t, l
			}
		}
		return kthAllowed(allowed, p.vocab, x), lp - 1
	}
	best, bestScore := int32(-1), float32(math.Inf(-1))
	for t := int32(0); uint64(t) < p.vocab; t++ {
		if !engine.MaskAllows(allowed, t) {
			continue
		}
		score := float32(mix.Mix64(x^uint64(t)*logitSalt)>>40) / float32(1<<24) * logprobMax
		if t == tok {
			score = logprobMax
		}
		score += sp.LogitBias[t]
		if n := gen[t]; n > 0 {
			score -= sp.PresencePenalty + float32(n)*sp.FrequencyPenalty
		}
		if score > bestScore {
			best, bestScore = t, score
		}
	}
	if best == tok {
		return tok, lp
	}
	return best, min(0, bestScore-logprobMax) - 1
}

// kthAllowed picks an allowed token by x.
func kthAllowed(allowed []uint64, vocab uint64, x uint64) int32 {
	words := (vocab + 63) / 64
	total := 0
	for i := uint64(0); i < words; i++ {
		total += bits.OnesCount64(allowedWord(allowed, i, vocab))
	}
	k := int(x % uint64(total))
	for i := uint64(0); i < words; i++ {
		w := allowedWord(allowed, i, vocab)
		c := bits.OnesCount64(w)
		if k >= c {
			k -= c
			continue
		}
		for ; k > 0; k-- {
			w &= w - 1
		}
		return int32(i*64) + int32(bits.TrailingZeros64(w))
	}
	return 0
}

func allowedWord(allowed []uint64, i, vocab uint64) uint64 {
	w := allowed[i]
	if i == (vocab+63)/64-1 && vocab%64 != 0 {
		w &= 1<<(vocab%64) - 1
	}
	return w
}

// top lists n tokens for TopLogprobs: the sampled one first, then
// allowed others chosen by the hash with falling log-probabilities.
func (p *picker) top(h uint64, tok int32, lp float32, n int, allowed []uint64) []engine.TokenLogprob {
	out := make([]engine.TokenLogprob, 0, n)
	out = append(out, engine.TokenLogprob{Token: tok, Logprob: lp})
	x := mix.Mix64(h ^ logitSalt)
	for i := 0; len(out) < n && i < 4*n+64; i++ {
		x = mix.Mix64(x + uint64(i))
		t := int32(x % p.vocab)
		if allowed != nil {
			t = kthAllowed(allowed, p.vocab, x)
		}
		if slices.ContainsFunc(out, func(e engine.TokenLogprob) bool { return e.Token == t }) {
			continue
		}
		out = append(out, engine.TokenLogprob{Token: t, Logprob: lp - float32(len(out))*0.5})
	}
	return out
}

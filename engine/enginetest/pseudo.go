package enginetest

import "slices"

// The simulated engine's "model" is a rolling hash over a sequence's token
// history. Every token fed mixes into the hash; the next token is drawn
// from the hash (and the seed when sampling), so it depends on the whole
// history and on nothing else — not on batching, chunking or prefix reuse.

const (
	hashStart  = 0x6a09e667f3bcc908
	hashPrime  = 0x100000001b3
	seedSalt   = 0x9e3779b97f4a7c15
	tokenSalt  = 0xbf58476d1ce4e5b9
	eosSalt    = 0x94d049bb133111eb
	unitDenom  = 1 << 53
	logprobMax = 8.0
)

// mix64 is the splitmix64 finaliser: a cheap bijective scramble.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// feed mixes tokens into the rolling hash h.
func feed(h uint64, tokens []int32) uint64 {
	for _, t := range tokens {
		h = mix64(h*hashPrime + uint64(uint32(t)) + 1)
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
	x := mix64(h ^ tokenSalt)
	if sampled {
		x = mix64(x ^ mix64(seed+seedSalt))
	}
	lp := -float32(x>>40) / float32(1<<24) * logprobMax
	if len(p.eos) > 0 && p.eosProb > 0 {
		u := float64(mix64(x^eosSalt)>>11) / unitDenom
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

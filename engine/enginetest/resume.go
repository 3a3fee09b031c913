package enginetest

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// checkResume: on a model that reports engine.Info.Resumes, a sequence
// resumed at a random position — opened with its prompt plus the tokens
// it had generated, SamplingParams.Generated set to their number — goes on
// with exactly the tokens of its uninterrupted run: seeded, penalised,
// both, greedy with penalties, the resumed prompt fed whole or in chunks
// and beside another sequence. A model that does not report it is not
// checked.
func checkResume(tb testing.TB, s *suite) {
	if !s.info.Resumes {
		tb.Logf("Info.Resumes is false: resuming seeded and penalised sequences is not checked")
		return
	}
	const n = 14
	cases := []struct {
		what   string
		params engine.SamplingParams
	}{
		{"seeded", engine.SamplingParams{Temperature: 1, Seed: 11, HasSeed: true}},
		{"seeded, top-k and top-p", engine.SamplingParams{Temperature: 0.9, TopK: 40, TopP: 0.95, Seed: 12, HasSeed: true}},
		{"presence and frequency penalties, greedy", engine.SamplingParams{PresencePenalty: 1.5, FrequencyPenalty: 1}},
		{"seeded and penalised", engine.SamplingParams{Temperature: 1, Seed: 13, HasSeed: true, PresencePenalty: 0.8, FrequencyPenalty: 1.2}},
	}
	rng := rand.New(rand.NewPCG(uint64(s.info.VocabSize), 0x5eed))
	for i, c := range cases {
		prompt := s.prompt(300+i, 7+i)
		full := s.alone(tb, s.m, prompt, n, &c.params)
		for _, chunk := range []int{0, 3} {
			g := 1 + rng.IntN(n-2) // the generated position to resume at
			p := c.params
			p.Generated = g
			resumed := &plan{id: s.id(), prompt: append(slices.Clone(prompt), full[:g]...), n: n - g, params: &p, chunk: chunk}
			other := &plan{id: s.id(), prompt: s.prompt(310+i, 5), n: n, params: &c.params}
			s.run(tb, s.m, resumed, other)
			if !slices.Equal(resumed.out, full[g:]) {
				tb.Errorf("%s, resumed after %d of %d tokens (chunks of %d): %v; uninterrupted it goes on with %v",
					c.what, g, n, chunk, resumed.out, full[g:])
			}
		}
	}
}

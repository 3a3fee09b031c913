package enginetest

import (
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// checkJumpForward: on a model that reports engine.Info.JumpForward, a
// sequence fed the token it sampled followed by the next k tokens of its
// run at once (forced, as jump-forward decoding feeds them) goes on with
// exactly the tokens of the run that sampled them one a step: seeded
// draws continue at the generated position and presence and frequency
// penalties count the forced tokens. A model that does not report it is
// not checked.
func checkJumpForward(tb testing.TB, s *suite) {
	if !s.info.JumpForward {
		tb.Logf("Info.JumpForward is false: forced tokens are not checked")
		return
	}
	const n, k = 12, 3
	cases := []struct {
		what   string
		params engine.SamplingParams
	}{
		{"greedy with penalties", engine.SamplingParams{PresencePenalty: 1.5, FrequencyPenalty: 1}},
		{"seeded and penalised", engine.SamplingParams{Temperature: 1, Seed: 21, HasSeed: true, PresencePenalty: 0.8, FrequencyPenalty: 1.2}},
	}
	for i, c := range cases {
		prompt := s.prompt(400+i, 6+i)
		full := s.alone(tb, s.m, prompt, n, &c.params)
		id := s.id()
		if _, err := s.m.Open(s.ctx, id, prompt, ""); err != nil {
			tb.Fatalf("%s: open: %v", c.what, err)
		}
		var got []int32
		feed := prompt
		for len(got) < n {
			o, err := s.m.Step(s.ctx, []engine.StepInput{{Seq: id, Tokens: feed, Sample: true, Params: &c.params}})
			if err != nil || len(o) != 1 {
				s.m.Free(id, "")
				tb.Fatalf("%s: step after %d tokens: %d outputs, %v", c.what, len(got), len(o), err)
			}
			got = append(got, o[0].Token)
			feed = []int32{o[0].Token}
			if len(got) == 2 && len(got)+k < n { // the next k tokens forced
				feed = append(feed, full[2:2+k]...)
				got = append(got, full[2:2+k]...)
			}
		}
		s.m.Free(id, "")
		if !slices.Equal(got, full) {
			tb.Errorf("%s, tokens 3-%d forced after the second: %v; sampled one a step: %v", c.what, 2+k, got, full)
		}
	}
}

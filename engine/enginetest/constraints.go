package enginetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// stepOne opens a sequence for prompt and generates n tokens, calling
// allowed before each sample for that step's mask (nil: no mask). It
// returns the outputs.
func (s *suite) stepOne(prompt []int32, n int, p *engine.SamplingParams, allowed func(step int) []uint64) ([]engine.StepOutput, error) {
	id := s.id()
	if _, err := s.m.Open(s.ctx, id, prompt, ""); err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	defer s.m.Free(id, "")
	var outs []engine.StepOutput
	feed := prompt
	for i := 0; i < n; i++ {
		in := engine.StepInput{Seq: id, Tokens: feed, Sample: true, Params: p}
		if allowed != nil {
			in.Allowed = allowed(i)
		}
		o, err := s.m.Step(s.ctx, []engine.StepInput{in})
		if err != nil {
			return outs, fmt.Errorf("step %d: %w", i, err)
		}
		if len(o) != 1 {
			return outs, fmt.Errorf("step %d: %d outputs for one sampling input", i, len(o))
		}
		outs = append(outs, o[0])
		feed = []int32{o[0].Token}
	}
	return outs, nil
}

// maskOf builds an allowed-token mask over vocab holding ids.
func maskOf(vocab int, ids ...int32) []uint64 {
	m := make([]uint64, engine.MaskWords(vocab))
	for _, id := range ids {
		m[id>>6] |= 1 << (id & 63)
	}
	return m
}

// checkConstraints: per-step allowed-token masks, logit bias and top
// log-probabilities reach the sampler, greedy and sampled; bad masks and
// biases are refused with *engine.InvalidParamError.
func checkConstraints(tb testing.TB, s *suite) {
	v := s.info.VocabSize
	prompt := s.prompt(41, 6)
	span := int32(min(v, 200))
	sets := [][]int32{{3 % span, 17 % span, 99 % span}, {5 % span}, {span - 1, 0, 42 % span, 7 % span}}
	for _, p := range []*engine.SamplingParams{{}, {Temperature: 1, Seed: 9, HasSeed: true, Logprobs: true}} {
		outs, err := s.stepOne(prompt, 9, p, func(i int) []uint64 { return maskOf(v, sets[i%len(sets)]...) })
		if err != nil {
			tb.Fatalf("masked generation (temperature %v): %v", p.Temperature, err)
		}
		for i, o := range outs {
			if !slices.Contains(sets[i%len(sets)], o.Token) {
				tb.Errorf("temperature %v, step %d: token %d outside the allowed set %v", p.Temperature, i, o.Token, sets[i%len(sets)])
			}
			if p.Logprobs && o.Logprob > 0 {
				tb.Errorf("step %d: logprob %v > 0", i, o.Logprob)
			}
		}
	}
	// A single allowed token is forced, EOS included.
	if len(s.info.EOS) > 0 {
		eos := s.info.EOS[0]
		outs, err := s.stepOne(prompt, 1, &engine.SamplingParams{}, func(int) []uint64 { return maskOf(v, eos) })
		if err != nil || outs[0].Token != eos {
			tb.Errorf("mask of EOS only: got %v, %v; want EOS %d", outs, err, eos)
		}
	}

	greedy, err := s.stepOne(prompt, 1, &engine.SamplingParams{}, nil)
	if err != nil {
		tb.Fatalf("greedy: %v", err)
	}
	g := greedy[0].Token
	target := (g + 1) % span
	outs, err := s.stepOne(prompt, 3, &engine.SamplingParams{LogitBias: map[int32]float32{target: 100}}, nil)
	if err != nil {
		tb.Fatalf("logit bias: %v", err)
	}
	for i, o := range outs {
		if o.Token != target {
			tb.Errorf("logit_bias +100 on %d: step %d got %d", target, i, o.Token)
		}
	}
	outs, err = s.stepOne(prompt, 1, &engine.SamplingParams{LogitBias: map[int32]float32{g: -100}}, nil)
	if err != nil {
		tb.Fatalf("logit bias: %v", err)
	}
	if outs[0].Token == g {
		tb.Errorf("logit_bias -100 on the greedy token %d: still picked", g)
	}

	mask := maskOf(v, sets[2]...)
	outs, err = s.stepOne(prompt, 2, &engine.SamplingParams{TopLogprobs: 3, Logprobs: true}, func(int) []uint64 { return mask })
	if err != nil {
		tb.Fatalf("top logprobs: %v", err)
	}
	for i, o := range outs {
		if len(o.Top) != 3 {
			tb.Fatalf("TopLogprobs 3: step %d has %d entries", i, len(o.Top))
		}
		if o.Top[0].Token != o.Token {
			tb.Errorf("greedy step %d: top entry %d, sampled %d", i, o.Top[0].Token, o.Token)
		}
		for j, e := range o.Top {
			if !slices.Contains(sets[2], e.Token) {
				tb.Errorf("step %d: top token %d is masked out", i, e.Token)
			}
			if e.Logprob > 0 || j > 0 && e.Logprob > o.Top[j-1].Logprob {
				tb.Errorf("step %d: top log-probabilities not falling and <= 0: %v", i, o.Top)
			}
		}
	}

	for name, c := range map[string]struct {
		p       *engine.SamplingParams
		allowed []uint64
	}{
		"empty mask":       {&engine.SamplingParams{}, make([]uint64, engine.MaskWords(v))},
		"short mask":       {&engine.SamplingParams{}, []uint64{1}},
		"bias outside":     {&engine.SamplingParams{LogitBias: map[int32]float32{int32(v): 1}}, nil},
		"bias too large":   {&engine.SamplingParams{LogitBias: map[int32]float32{1: 101}}, nil},
		"top_logprobs 21":  {&engine.SamplingParams{TopLogprobs: 21}, nil},
		"presence penalty": {&engine.SamplingParams{PresencePenalty: 2.5}, nil},
	} {
		if name == "short mask" && v <= 64 {
			continue
		}
		_, err := s.stepOne(prompt, 1, c.p, func(int) []uint64 { return c.allowed })
		var ip *engine.InvalidParamError
		if !errors.As(err, &ip) || !errors.Is(err, engine.ErrInvalidParam) {
			tb.Errorf("%s: got %v, want an *engine.InvalidParamError", name, err)
		}
	}
	// The model still serves after refusals.
	if _, err := s.stepOne(prompt, 1, &engine.SamplingParams{}, nil); err != nil {
		tb.Errorf("after refused steps: %v", err)
	}
}

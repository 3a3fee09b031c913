package engine

import (
	"fmt"
	"math"
)

// SamplingParams choose how a sequence picks its next token. The zero value
// is greedy decoding.
type SamplingParams struct {
	// Temperature scales logits; 0 means greedy (argmax). Range [0, 2].
	Temperature float32
	// TopP keeps the smallest set of tokens whose probability sums to TopP.
	// 0 or 1 disables it. Range (0, 1].
	TopP float32
	// TopK keeps the K most likely tokens. 0 disables it.
	TopK int
	// MinP drops tokens whose probability is below MinP times the top
	// token's. 0 disables it. Range [0, 1).
	MinP float32
	// RepetitionPenalty divides positive logits (multiplies negative ones)
	// of tokens already in the sequence. 0 or 1 disables it. Range (0, 2].
	RepetitionPenalty float32
	// Seed makes sampling reproducible when HasSeed is set: the same seed,
	// prompt and parameters give the same tokens.
	Seed    uint64
	HasSeed bool
	// Logprobs asks for the sampled token's log-probability.
	Logprobs bool
}

// Greedy reports whether the parameters pick the argmax token.
func (p *SamplingParams) Greedy() bool { return p.Temperature == 0 }

// Validate checks the ranges documented on each field.
func (p *SamplingParams) Validate() error {
	bad := func(field string, v any, want string) error {
		return &InvalidParamError{Param: field, Reason: fmt.Sprintf("%v is out of range: want %s", v, want)}
	}
	switch {
	case isNaN(p.Temperature) || p.Temperature < 0 || p.Temperature > 2:
		return bad("temperature", p.Temperature, "0 to 2")
	case isNaN(p.TopP) || p.TopP < 0 || p.TopP > 1:
		return bad("top_p", p.TopP, "greater than 0, at most 1")
	case p.TopK < 0:
		return bad("top_k", p.TopK, "0 (off) or more")
	case isNaN(p.MinP) || p.MinP < 0 || p.MinP >= 1:
		return bad("min_p", p.MinP, "0 (off) to below 1")
	case isNaN(p.RepetitionPenalty) || p.RepetitionPenalty < 0 || p.RepetitionPenalty > 2:
		return bad("repetition_penalty", p.RepetitionPenalty, "0 (off) to 2")
	}
	return nil
}

func isNaN(f float32) bool { return math.IsNaN(float64(f)) }

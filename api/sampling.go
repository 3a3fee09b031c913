package api

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
	// prompt and parameters give the same tokens. An engine whose
	// Info.Resumes is set makes each draw a function of the seed and the
	// generated position (see Generated).
	Seed    uint64
	HasSeed bool
	// Logprobs asks for the sampled token's log-probability.
	Logprobs bool
	// TopLogprobs asks for the log-probabilities of the N most likely
	// tokens as well (StepOutput.Top). 0 turns it off. Range [0, 20].
	TopLogprobs int
	// LogitBias adds its value to the logit of each listed token id, as
	// OpenAI's logit_bias does: -100 in effect bans a token, 100 in effect
	// forces it. Values in [-100, 100]; ids outside the vocabulary are
	// refused with an *InvalidParamError.
	LogitBias map[int32]float32
	// PresencePenalty is subtracted once from the logit of every token
	// the sequence has generated so far; FrequencyPenalty is subtracted
	// once per time it was generated (OpenAI's presence_penalty and
	// frequency_penalty). Generated tokens are those fed after the
	// sequence's first sampling step, and the prompt's last Generated
	// tokens. Range [-2, 2]; 0 turns each off.
	PresencePenalty  float32
	FrequencyPenalty float32
	// Generated is how many of the prompt's last tokens this request generated
	// before it was resumed: a seeded draw continues at that position and
	// presence/frequency penalties count those tokens as generated.
	Generated int
}

// Sampling applies its steps in this order: repetition penalty,
// presence and frequency penalties, logit bias, the step's allowed-token
// mask (StepInput.Allowed); log-probabilities are taken there; then
// temperature, top-k, top-p and min-p, and the draw.

// Adjusts reports whether the parameters change logits before sampling
// beyond the repetition penalty: a logit bias or a presence or frequency
// penalty.
func (p *SamplingParams) Adjusts() bool {
	return len(p.LogitBias) > 0 || p.PresencePenalty != 0 || p.FrequencyPenalty != 0
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
	case p.TopLogprobs < 0 || p.TopLogprobs > 20:
		return bad("top_logprobs", p.TopLogprobs, "0 to 20")
	case isNaN(p.PresencePenalty) || p.PresencePenalty < -2 || p.PresencePenalty > 2:
		return bad("presence_penalty", p.PresencePenalty, "-2 to 2")
	case isNaN(p.FrequencyPenalty) || p.FrequencyPenalty < -2 || p.FrequencyPenalty > 2:
		return bad("frequency_penalty", p.FrequencyPenalty, "-2 to 2")
	case p.Generated < 0:
		return bad("generated", p.Generated, "0 or more")
	}
	for id, b := range p.LogitBias {
		if id < 0 {
			return bad("logit_bias", id, "token ids of the vocabulary")
		}
		if isNaN(b) || b < -100 || b > 100 {
			return bad("logit_bias", b, "-100 to 100")
		}
	}
	return nil
}

// CheckVocab refuses logit-bias ids at or above vocab.
func (p *SamplingParams) CheckVocab(vocab int) error {
	for id := range p.LogitBias {
		if int(id) >= vocab {
			return &InvalidParamError{Param: "logit_bias", Reason: fmt.Sprintf("token id %d is outside the vocabulary of %d", id, vocab)}
		}
	}
	return nil
}

func isNaN(f float32) bool { return math.IsNaN(float64(f)) }

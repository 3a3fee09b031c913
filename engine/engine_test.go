package engine_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

func TestSamplingParamsValidate(t *testing.T) {
	nan := float32(math.NaN())
	tests := []struct {
		name  string
		p     engine.SamplingParams
		param string // "" means valid
	}{
		{"zero value is greedy", engine.SamplingParams{}, ""},
		{"typical", engine.SamplingParams{Temperature: 0.7, TopP: 0.9, TopK: 40, MinP: 0.05, RepetitionPenalty: 1.1}, ""},
		{"temperature 5", engine.SamplingParams{Temperature: 5}, "temperature"},
		{"temperature negative", engine.SamplingParams{Temperature: -0.1}, "temperature"},
		{"temperature NaN", engine.SamplingParams{Temperature: nan}, "temperature"},
		{"top_p above 1", engine.SamplingParams{TopP: 1.5}, "top_p"},
		{"top_p negative", engine.SamplingParams{TopP: -1}, "top_p"},
		{"top_k negative", engine.SamplingParams{TopK: -1}, "top_k"},
		{"min_p 1", engine.SamplingParams{MinP: 1}, "min_p"},
		{"repetition penalty 3", engine.SamplingParams{RepetitionPenalty: 3}, "repetition_penalty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			if tt.param == "" {
				if err != nil {
					t.Fatalf("valid params refused: %v", err)
				}
				return
			}
			var ip *engine.InvalidParamError
			if !errors.As(err, &ip) || ip.Param != tt.param || !errors.Is(err, engine.ErrInvalidParam) {
				t.Fatalf("want InvalidParamError for %s, got %v", tt.param, err)
			}
		})
	}
}

func TestErrorsCarryTheirNumbers(t *testing.T) {
	err := fmt.Errorf("open: %w", &engine.ContextLengthError{Model: "m", Prompt: 900, MaxNew: 200, Limit: 1024})
	if !errors.Is(err, engine.ErrContextLength) || !strings.Contains(err.Error(), "1100 (900 prompt + 200 to generate)") {
		t.Fatalf("%v", err)
	}
	err = &engine.CheckpointError{Path: "model.safetensors", Tensor: "lm_head.weight", Reason: "shape [10 4] contradicts config.json"}
	if !errors.Is(err, engine.ErrBadCheckpoint) || !strings.Contains(err.Error(), `"lm_head.weight"`) {
		t.Fatalf("%v", err)
	}
}

func TestConstraintParams(t *testing.T) {
	for _, p := range []engine.SamplingParams{
		{TopLogprobs: 21}, {TopLogprobs: -1}, {PresencePenalty: 2.1}, {FrequencyPenalty: -2.1},
		{LogitBias: map[int32]float32{1: 100.5}}, {LogitBias: map[int32]float32{-1: 1}},
	} {
		if err := p.Validate(); !errors.Is(err, engine.ErrInvalidParam) {
			t.Errorf("Validate(%+v) = %v, want engine.ErrInvalidParam", p, err)
		}
	}
	ok := engine.SamplingParams{TopLogprobs: 20, PresencePenalty: -2, FrequencyPenalty: 2, LogitBias: map[int32]float32{0: -100, 9: 100}}
	if err := ok.Validate(); err != nil {
		t.Errorf("Validate(%+v) = %v", ok, err)
	}
	if err := ok.CheckVocab(9); !errors.Is(err, engine.ErrInvalidParam) {
		t.Errorf("CheckVocab: bias id 9 in a vocabulary of 9 accepted: %v", err)
	}
	if err := engine.CheckMask(nil, 100); err != nil {
		t.Errorf("nil mask: %v", err)
	}
	if err := engine.CheckMask([]uint64{1 << 3, 0}, 100); err != nil || !engine.MaskAllows([]uint64{1 << 3, 0}, 3) || engine.MaskAllows([]uint64{1 << 3, 0}, 4) {
		t.Errorf("mask allowing 3: %v", err)
	}
	for _, m := range [][]uint64{{1}, {0, 0}, {0, 1 << 40}} {
		if err := engine.CheckMask(m, 100); !errors.Is(err, engine.ErrInvalidParam) {
			t.Errorf("engine.CheckMask(%v, 100) = %v, want engine.ErrInvalidParam", m, err)
		}
	}
}

package engine

import (
	"fmt"

	"github.com/mlxserving/mlxserving/api"
)

// SamplingParams choose how a sequence picks its next token; the type
// lives in api so a request carries it without importing the engine
// contract. The zero value is greedy decoding.
type SamplingParams = api.SamplingParams

// MaskWords is the number of 64-bit words of an allowed-token mask over a
// vocabulary of vocab ids.
func MaskWords(vocab int) int { return (vocab + 63) / 64 }

// CheckMask refuses an allowed-token mask that is too short for vocab or
// allows no token of it. A nil mask allows every token.
func CheckMask(mask []uint64, vocab int) error {
	if mask == nil {
		return nil
	}
	if len(mask) < MaskWords(vocab) {
		return &InvalidParamError{Param: "allowed", Reason: fmt.Sprintf("mask of %d words; a vocabulary of %d needs %d", len(mask), vocab, MaskWords(vocab))}
	}
	for i, w := range mask[:MaskWords(vocab)] {
		if i == MaskWords(vocab)-1 && vocab%64 != 0 {
			w &= 1<<(vocab%64) - 1
		}
		if w != 0 {
			return nil
		}
	}
	return &InvalidParamError{Param: "allowed", Reason: "the mask allows no token"}
}

// MaskAllows reports whether mask allows id (a nil mask allows all).
func MaskAllows(mask []uint64, id int32) bool {
	if mask == nil {
		return true
	}
	return id >= 0 && int(id>>6) < len(mask) && mask[id>>6]&(1<<(id&63)) != 0
}

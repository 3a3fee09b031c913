package merge

import (
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// BenchmarkKeyOf hashes a request with a 512-token prompt and seeded
// sampling: the per-request cost of naming a generation.
func BenchmarkKeyOf(b *testing.B) {
	prompt := make([]int32, 512)
	for i := range prompt {
		prompt[i] = int32(i * 7)
	}
	r := Request{Model: "llama", Revision: "/models/llama#1", Prompt: prompt, MaxTokens: 256,
		Sampling: engine.SamplingParams{Temperature: 0.7, TopP: 0.9, Seed: 42, HasSeed: true}, StopTokens: []int32{2, 128001}}
	for b.Loop() {
		_ = KeyOf(r)
	}
}

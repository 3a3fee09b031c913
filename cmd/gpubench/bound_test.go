package main

import (
	"testing"

	"github.com/mlxserving/mlxserving/testmodel"
)

// TestWeightBytes checks the decode bound's bytes against the published
// parameter counts: Llama-3.1-8B's 8.0B less one of its two embeddings
// (a step reads one row of the input embedding), and Qwen3-30B-A3B's
// 3.3B active less the same.
func TestWeightBytes(t *testing.T) {
	for _, c := range []struct {
		name     string
		cfg      testmodel.Config
		min, max float64 // parameters, billions
	}{
		{"llama8b", testmodel.Llama8B(), 7.4, 7.6},
		{"qwen3-30b-a3b (active)", testmodel.Qwen3_30B_A3B(), 2.95, 3.1},
		{"qwen3-32b (head_dim 128 over 64 heads of 5120)", testmodel.Qwen3_32B(), 31.0, 32.5},
	} {
		got := weightBytes(c.cfg) / 2 / 1e9
		if got < c.min || got > c.max {
			t.Errorf("%s: %.2fB parameters read a step, want %.2f-%.2fB", c.name, got, c.min, c.max)
		}
	}
}

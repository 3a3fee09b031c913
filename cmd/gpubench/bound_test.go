package main

import (
	"math"
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

// TestStepBytes checks a mixture's decode bound at larger batches: one
// token reads its k experts (weightBytes), a batch the experts it
// touches on average (Qwen3-30B-A3B: about 51 of 128 at 8 tokens, 126 at
// 64, as moe_kernels_cuda.py counted on random routings), and a dense
// model the same bytes at every batch.
func TestStepBytes(t *testing.T) {
	moe := testmodel.Qwen3_30B_A3B()
	expert := 2 * 3 * 2048 * 768.0
	if got, want := stepBytes(moe, 1), weightBytes(moe); math.Abs(got-want) > 1 {
		t.Errorf("batch 1: %.4g bytes, want weightBytes %.4g", got, want)
	}
	for _, c := range []struct {
		batch   int
		touched float64
	}{{8, 51.6}, {64, 125.9}} {
		got := (stepBytes(moe, c.batch) - weightBytes(moe)) / (48 * expert)
		if math.Abs(got-(c.touched-8)) > 0.1 {
			t.Errorf("batch %d: %.1f experts a layer beyond the 8 of one token, want %.1f", c.batch, got, c.touched-8)
		}
	}
	dense := testmodel.Llama8B()
	if stepBytes(dense, 64) != weightBytes(dense) {
		t.Error("a dense model's step reads more at batch 64 than at 1")
	}
}

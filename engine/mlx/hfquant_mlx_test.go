//go:build mlx

package mlx

import (
	"testing"

	"github.com/mlxserving/mlxserving/testmodel"
)

// TestHFQuantMatchesReference serves testmodel's transformers-quantized
// checkpoints (AWQ and GPTQ requantized to MLX affine 4-bit, FP8
// dequantized at load) against internal/reference's forward pass over its
// own dequantization of the same files: the same greedy tokens and
// log-probabilities within 1e-4, alone, in chunks and batched. Block FP8
// on qwen3_moe covers the experts.
func TestHFQuantMatchesReference(t *testing.T) {
	py := python(t)
	e := newEngine(t)
	for _, q := range testmodel.Quants() {
		t.Run(q, func(t *testing.T) {
			c := testmodel.TinyQuant()
			c.Quant = q
			matchReference(t, py, e, c)
		})
	}
	t.Run("qwen3_moe-fp8", func(t *testing.T) {
		c := testmodel.TinyFamily("qwen3_moe")
		c.Quant = testmodel.QuantFP8Block
		matchReference(t, py, e, c)
	})
}

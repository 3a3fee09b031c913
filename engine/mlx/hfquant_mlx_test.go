//go:build mlx

package mlx

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/safetensors"
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

// TestHFQuantLoad: an AWQ checkpoint reports the 4-bit weights' bytes
// (Info.WeightBytes below the float model's), and a scale holding NaN is
// refused as a CheckpointError naming it, with the engine serving on.
func TestHFQuantLoad(t *testing.T) {
	e := newEngine(t)
	cfg := testmodel.TinyQuant()
	float := load(t, e, writeTiny(t, cfg))
	defer float.Close()
	cfg.Quant = testmodel.QuantAWQ
	dir := writeTiny(t, cfg)
	m := load(t, e, dir)
	defer m.Close()
	if q, f := m.Info().WeightBytes, float.Info().WeightBytes; q <= 0 || q >= f*2/3 {
		t.Errorf("WeightBytes %d for AWQ, %d for float: want the 4-bit size", q, f)
	}
	const scales = "model.layers.1.self_attn.q_proj.scales"
	raw, err := os.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	h, err := safetensors.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	at := h.DataOffset + h.Tensors[scales].Begin
	binary.LittleEndian.PutUint16(raw[at:], 0x7E00) // NaN in float16
	bad := t.TempDir()
	for _, f := range []string{"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(bad, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(bad, "model.safetensors"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if m2, err := e.Load(context.Background(), engine.ModelSpec{ID: "nan", Path: bad}); !errors.Is(err, engine.ErrBadCheckpoint) || !strings.Contains(err.Error(), scales) {
		t.Errorf("a NaN scale: %v, want a CheckpointError naming %s", err, scales)
		if m2 != nil {
			m2.Close()
		}
	}
	generate(t, m, 1, prompts()[0], 3, 100, nil)
}

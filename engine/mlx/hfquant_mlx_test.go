//go:build mlx

package mlx

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestHFQuantMatchesReference serves testmodel's transformers-quantized
// checkpoints (the 4-bit layouts requantized to MLX affine 4-bit, act
// order's inputs gathered in its order; FP8 dequantized at load) against
// internal/reference's forward pass over its own dequantization of the
// same files: the same greedy tokens and log-probabilities within 1e-4,
// alone, in chunks and batched. Block FP8 on qwen3_moe covers the
// experts; act order with k_proj's groups apart from q's and v's covers
// modules that read one input in different orders (not fused).
func TestHFQuantMatchesReference(t *testing.T) {
	py := python(t)
	e := newEngine(t)
	for _, q := range testmodel.AllQuants() {
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
	t.Run("gptq-actorder-k-apart", func(t *testing.T) {
		c := testmodel.TinyQuant()
		c.Quant = testmodel.QuantGPTQActOrder
		dir := writeTiny(t, c)
		// Inputs 0 and the first of another group trade groups in layer 0's
		// k_proj: a valid act order of its own (every group still 128
		// inputs), a model of its own, which the reference reads too.
		editTensor(t, dir, "model.layers.0.self_attn.k_proj.g_idx", func(b []byte) {
			g0 := binary.LittleEndian.Uint32(b)
			for k := 1; ; k++ {
				if g := binary.LittleEndian.Uint32(b[4*k:]); g != g0 {
					binary.LittleEndian.PutUint32(b, g)
					binary.LittleEndian.PutUint32(b[4*k:], g0)
					return
				}
			}
		})
		m := load(t, e, dir)
		if l0, l1 := m.w.layers[0], m.w.layers[1]; !isNull(l0.qkv.w) || isNull(l0.k.perm) || isNull(l1.qkv.perm) {
			t.Error("layer 0's q, k, v fused across input orders, or layer 1's not fused with theirs")
		}
		m.Close()
		matchReferenceDir(t, py, e, dir, c.Arch)
	})
}

// TestHFQuantLoad: an AWQ checkpoint reports the 4-bit weights' bytes
// (Info.WeightBytes below the float model's); an act-order GPTQ
// checkpoint fuses q, k, v and gate, up, each with one input order; a
// scale holding NaN, and
// act order in a mixture's experts (whose products are gathered over
// experts, in one input order), are refused as CheckpointErrors naming
// the tensor, with the engine serving on.
func TestHFQuantLoad(t *testing.T) {
	e := newEngine(t)
	cfg := testmodel.TinyQuant()
	float := load(t, e, writeTiny(t, cfg))
	defer float.Close()
	cfg.Quant = testmodel.QuantAWQ
	m := load(t, e, writeTiny(t, cfg))
	defer m.Close()
	if q, f := m.Info().WeightBytes, float.Info().WeightBytes; q <= 0 || q >= f*2/3 {
		t.Errorf("WeightBytes %d for AWQ, %d for float: want the 4-bit size", q, f)
	}
	cfg.Quant = testmodel.QuantGPTQActOrder
	ao := load(t, e, writeTiny(t, cfg))
	defer ao.Close()
	for i, l := range ao.w.layers { // GPTQ's act order: one per input
		if isNull(l.qkv.perm) || isNull(l.gateUp.perm) || isNull(l.o.perm) || isNull(l.down.perm) {
			t.Errorf("act order, layer %d: q, k, v or gate, up not fused in one input order, or o or down without theirs", i)
		}
	}
	refused := func(what, dir, tensor string) {
		t.Helper()
		if m2, err := e.Load(context.Background(), engine.ModelSpec{ID: "bad", Path: dir}); !errors.Is(err, engine.ErrBadCheckpoint) || !strings.Contains(err.Error(), tensor) {
			t.Errorf("%s: %v, want a CheckpointError naming %s", what, err, tensor)
			if m2 != nil {
				m2.Close()
			}
		}
	}
	const scales = "model.layers.1.self_attn.q_proj.scales"
	cfg.Quant = testmodel.QuantAWQ
	bad := writeTiny(t, cfg)
	editTensor(t, bad, scales, func(b []byte) { binary.LittleEndian.PutUint16(b, 0x7E00) }) // NaN in float16
	refused("a NaN scale", bad, scales)
	moe := testmodel.TinyFamily("qwen3_moe")
	moe.Hidden, moe.Intermediate, moe.Quant = 256, 256, testmodel.QuantGPTQActOrder // experts 128 wide
	refused("act order in the experts", writeTiny(t, moe), ".experts.0.gate_proj")
	generate(t, m, 1, prompts()[0], 3, 100, nil)
}

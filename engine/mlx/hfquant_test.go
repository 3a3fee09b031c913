package mlx

import (
	"context"
	"errors"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/internal/reference"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestConvertHF converts testmodel.TinyQuant in every transformers
// layout and checks the tensors the engine would load: the modules plan
// (4-bit as MLX affine with the checkpoint's group, FP8 as float), and
// each projection's weights (MLX's scale * q + bias for 4-bit, the
// dequantized floats for FP8) against internal/reference's dequantization
// of the same file: exact for 4-bit, within float32 rounding for FP8.
func TestConvertHF(t *testing.T) {
	py := os.Getenv("MLXSERVING_PYTHON")
	if py == "" {
		t.Skip("MLXSERVING_PYTHON is not set (the reference dequantizes with torch)")
	}
	names := []string{"model.layers.0.self_attn.k_proj", "model.layers.1.mlp.down_proj", "model.layers.1.self_attn.o_proj"}
	for _, q := range testmodel.Quants() {
		t.Run(q, func(t *testing.T) {
			cfg := testmodel.TinyQuant()
			cfg.Quant = q
			dir := writeTiny(t, cfg)
			c, err := readConfig(dir)
			if err != nil {
				t.Fatal(err)
			}
			man, _, err := manifest(dir)
			if err != nil {
				t.Fatal(err)
			}
			man, conv, err := convertHF(c.HF, man, "F32")
			if err != nil {
				t.Fatal(err)
			}
			mods, err := planModules(c, man)
			if err != nil {
				t.Fatal(err)
			}
			int4 := q == testmodel.QuantAWQ || q == testmodel.QuantGPTQ
			for _, m := range mods {
				if strings.Contains(m.Name, "_proj") && (m.Quant != nil) != int4 {
					t.Errorf("%s: quantized %v", m.Name, m.Quant != nil)
				}
				if m.Quant != nil && (m.Quant.Bits != 4 || m.Quant.GroupSize != 128) {
					t.Errorf("%s: %+v, want 4 bits in groups of 128", m.Name, *m.Quant)
				}
			}
			wnames := make([]string, len(names))
			for i, n := range names {
				wnames[i] = n + ".weight"
			}
			want, err := reference.Weights(context.Background(), py, dir, wnames)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range names {
				got := hfWeight(t, conv, n, int4)
				w := want[n+".weight"]
				if len(got) != len(w) {
					t.Fatalf("%s: %d values, want %d", n, len(got), len(w))
				}
				for i := range got {
					if d := math.Abs(got[i] - w[i]); (int4 && d != 0) || d > 1e-6*math.Abs(w[i]) {
						t.Fatalf("%s[%d] = %v, reference %v", n, i, got[i], w[i])
					}
				}
			}
		})
	}
}

// hfWeight is module n's weight [out, in] from its converted tensors.
func hfWeight(t *testing.T, conv map[string]func() (hfTensor, error), n string, int4 bool) []float64 {
	t.Helper()
	get := func(name string) hfTensor {
		mk, ok := conv[name]
		if !ok {
			t.Fatalf("no converted %s", name)
		}
		h, err := mk()
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	w := get(n + ".weight")
	if !int4 {
		out := make([]float64, len(w.F32))
		for i, v := range w.F32 {
			out[i] = float64(v)
		}
		return out
	}
	s, b := get(n+".scales"), get(n+".biases")
	rows, in := w.Shape[0], w.Shape[1]*8
	ng := s.Shape[1]
	out := make([]float64, rows*in)
	for o := range rows {
		for k := range in {
			q := w.U32[o*(in/8)+k/8] >> (4 * (k % 8)) & 15 // MLX: element j of a word in bits 4j
			g := o*ng + k/(in/ng)
			out[o*in+k] = float64(s.F32[g]*float32(q) + b.F32[g])
		}
	}
	return out
}

// TestHFQuantRefused: each edit of enginetest.HostileQuantConfigs is a
// CheckpointError naming the field, read from config.json before any
// weight; a NaN scale is one when the tensor is converted.
func TestHFQuantRefused(t *testing.T) {
	for _, h := range enginetest.HostileQuantConfigs() {
		dir := t.TempDir()
		if err := h.Write(dir); err != nil {
			t.Fatal(err)
		}
		_, err := readConfig(dir)
		if !errors.Is(err, engine.ErrBadCheckpoint) || !strings.Contains(err.Error(), h.Key) {
			t.Errorf("%s: %v, want a CheckpointError naming %s", h.Name, err, h.Key)
		}
	}
}

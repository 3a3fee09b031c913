package mlx

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/internal/reference"
	"github.com/mlxserving/mlxserving/internal/safetensors"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestConvertHF converts testmodel.TinyQuant in every transformers
// layout and checks the tensors the engine would load: the modules plan
// (4-bit as MLX affine with the checkpoint's group, FP8 as float), and
// each projection's weights (MLX's scale * q + bias for 4-bit, its
// columns in the module's input order under act order; the dequantized
// floats for FP8) against internal/reference's dequantization of the same
// file: exact for 4-bit with half-precision scales (AWQ, GPTQ), within
// float32 rounding for float32 scales (compressed-tensors in a float32
// model) and FP8.
func TestConvertHF(t *testing.T) {
	py := os.Getenv("MLXSERVING_PYTHON")
	if py == "" {
		t.Skip("MLXSERVING_PYTHON is not set (the reference dequantizes with torch)")
	}
	names := []string{"model.layers.0.self_attn.k_proj", "model.layers.1.mlp.down_proj", "model.layers.1.self_attn.o_proj"}
	for _, q := range testmodel.AllQuants() {
		t.Run(q, func(t *testing.T) {
			cfg := testmodel.TinyQuant()
			cfg.Quant = q
			dir := writeTiny(t, cfg)
			c, file := readCheckpoint(t, dir)
			man, conv, err := convertHF(c.HF, file, "F32")
			if err != nil {
				t.Fatal(err)
			}
			mods, err := planModules(c, man)
			if err != nil {
				t.Fatal(err)
			}
			int4 := q != testmodel.QuantFP8Block && q != testmodel.QuantFP8Channel
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
				amax := 0.0
				for _, v := range w {
					amax = math.Max(amax, math.Abs(v))
				}
				for i := range got {
					bound := 1e-6 * math.Abs(w[i]) // FP8: the float32 product rounds
					if int4 {
						bound = 0 // half-precision scales: s·q and the bias are exact in float32
						if file[n+".weight_scale"].DType == "F32" {
							bound = 1e-6 * amax // float32 scales: s·q, the bias and their sum round
						}
					}
					if d := math.Abs(got[i] - w[i]); d > bound {
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
	var perm []uint32 // the input of each column: act order's, or in order
	if _, ok := conv[n+".perm"]; ok {
		perm = get(n + ".perm").U32
	}
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
			g, col := o*ng+k/(in/ng), k
			if perm != nil {
				col = int(perm[k])
			}
			out[o*in+col] = float64(s.F32[g]*float32(q) + b.F32[g])
		}
	}
	return out
}

// TestHFQuantRefused: each edit of enginetest.HostileQuantConfigs the
// engine does not serve, and of mlxHostileQuants, is a CheckpointError
// naming the field, read from config.json before any weight.
func TestHFQuantRefused(t *testing.T) {
	for _, h := range append(enginetest.HostileQuantConfigs(), mlxHostileQuants()...) {
		if slices.Contains(h.Served, "mlx") {
			continue
		}
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

// mlxHostileQuants are quantization_config edits this engine refuses that
// the torch engine's refusals do not name alike (it refuses every
// pack-quantized checkpoint by its format) or lets through.
func mlxHostileQuants() []enginetest.HostileQuant {
	scheme := func(edit func(w map[string]any)) map[string]any {
		w := map[string]any{"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": true, "dynamic": false}
		edit(w)
		return map[string]any{"group_0": map[string]any{"targets": []string{"Linear"}, "weights": w}}
	}
	two := scheme(func(map[string]any) {})
	two["group_1"] = map[string]any{"targets": []string{"re:.*down_proj"}, "weights": map[string]any{
		"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": true}}
	return []enginetest.HostileQuant{
		{Name: "8-bit compressed int", Quant: testmodel.QuantW4A16, Key: "config_groups",
			Value: scheme(func(w map[string]any) { w["num_bits"] = 8 })},
		{Name: "compressed-tensors groups of 96", Quant: testmodel.QuantW4A16, Key: "config_groups",
			Value: scheme(func(w map[string]any) { w["group_size"] = 96 })},
		{Name: "compressed-tensors per channel", Quant: testmodel.QuantW4A16, Key: "config_groups",
			Value: scheme(func(w map[string]any) { w["strategy"] = "channel"; w["group_size"] = nil })},
		{Name: "compressed-tensors dynamic weights", Quant: testmodel.QuantW4A16, Key: "config_groups",
			Value: scheme(func(w map[string]any) { w["dynamic"] = true })},
		{Name: "compressed-tensors of two schemes", Quant: testmodel.QuantW4A16, Key: "config_groups", Value: two},
		{Name: "compressed-tensors without groups", Quant: testmodel.QuantW4A16, Key: "config_groups", Value: map[string]any{}},
		{Name: "compressed-tensors 2:4 sparse", Quant: testmodel.QuantW4A16, Key: "sparsity_config",
			Value: map[string]any{"format": "sparse-24-bitmask", "sparsity_structure": "2:4", "targets": []string{"Linear"}}},
		{Name: "GPTQ packed in int16", Quant: testmodel.QuantGPTQv2, Key: "pack_dtype", Value: "int16"},
		{Name: "GPTQ in Marlin's layout", Quant: testmodel.QuantGPTQ, Key: "is_marlin_format", Value: true},
	}
}

// TestHFQuantTensorsRefused: 4-bit modules whose tensors are missing, of
// the wrong dtype or shape, or hold values the engine cannot serve
// (NaN scales, a weight_shape the others contradict, g_idx groups of
// unequal sizes or past the last) are CheckpointErrors naming the
// tensor, when the manifest is converted or the module made.
func TestHFQuantTensorsRefused(t *testing.T) {
	const mod = "model.layers.1.mlp.down_proj." // [256, 512]: 4 groups of 128
	f32 := func(v float32) func([]byte) {
		return func(b []byte) { binary.LittleEndian.PutUint32(b[4:], math.Float32bits(v)) }
	}
	u32 := func(at int, v uint32) func([]byte) {
		return func(b []byte) { binary.LittleEndian.PutUint32(b[4*at:], v) }
	}
	cases := []struct {
		name, quant, tensor string
		man                 func(map[string]tensorInfo) // an edit of the manifest, or
		file                func([]byte)                // of the tensor's bytes
	}{
		{"no scales", testmodel.QuantW4A16, "weight_scale", func(m map[string]tensorInfo) { delete(m, mod+"weight_scale") }, nil},
		{"no zero points", testmodel.QuantW4A16Asym, "weight_zero_point", func(m map[string]tensorInfo) { delete(m, mod+"weight_zero_point") }, nil},
		{"zero points unpacked", testmodel.QuantW4A16Asym, "weight_zero_point", func(m map[string]tensorInfo) {
			m[mod+"weight_zero_point"] = tensorInfo{File: m[mod+"weight_packed"].File, DType: "I8", Shape: []int{256, 4}}
		}, nil},
		{"packed along the output", testmodel.QuantW4A16, "weight_packed", func(m map[string]tensorInfo) {
			m[mod+"weight_packed"] = tensorInfo{File: m[mod+"weight_packed"].File, DType: "I32", Shape: []int{32, 512}}
		}, nil},
		{"weight_shape of three", testmodel.QuantW4A16, "weight_shape", func(m map[string]tensorInfo) {
			m[mod+"weight_shape"] = tensorInfo{File: m[mod+"weight_shape"].File, DType: "I64", Shape: []int{3}}
		}, nil},
		{"weight_shape contradicting", testmodel.QuantW4A16, "weight_shape", nil, u32(2, 500)},
		{"a NaN scale", testmodel.QuantW4A16, "weight_scale", nil, f32(float32(math.NaN()))},
		{"a negative scale", testmodel.QuantGPTQv2, "scales", nil, func(b []byte) { binary.LittleEndian.PutUint16(b[2:], 0xBC00) }},
		{"g_idx of the wrong size", testmodel.QuantGPTQActOrder, "g_idx", func(m map[string]tensorInfo) {
			m[mod+"g_idx"] = tensorInfo{File: m[mod+"g_idx"].File, DType: "I32", Shape: []int{256}}
		}, nil},
		{"g_idx past the last group", testmodel.QuantGPTQActOrder, "g_idx", nil, u32(3, 4)},
		{"weight_g_idx negative", testmodel.QuantW4A16ActOrder, "weight_g_idx", nil, u32(5, 0xFFFFFFFF)},
		{"g_idx groups of unequal sizes", testmodel.QuantGPTQActOrder, "g_idx", nil, func(b []byte) {
			g := binary.LittleEndian.Uint32(b)
			binary.LittleEndian.PutUint32(b, (g+1)%4)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testmodel.TinyQuant()
			cfg.Quant = tc.quant
			dir := writeTiny(t, cfg)
			if tc.file != nil {
				editTensor(t, dir, mod+tc.tensor, tc.file)
			}
			c, man := readCheckpoint(t, dir)
			if tc.man != nil {
				tc.man(man)
			}
			_, conv, err := convertHF(c.HF, man, "F32")
			if err == nil {
				_, err = conv[mod+"weight"]()
			}
			if !errors.Is(err, engine.ErrBadCheckpoint) || !strings.Contains(err.Error(), mod+tc.tensor) {
				t.Errorf("%v, want a CheckpointError naming %s", err, mod+tc.tensor)
			}
		})
	}
}

// readCheckpoint reads dir's config and tensor manifest.
func readCheckpoint(t *testing.T, dir string) (*modelConfig, map[string]tensorInfo) {
	t.Helper()
	c, err := readConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	man, _, err := manifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	return c, man
}

// editTensor lets edit change the bytes of tensor name in dir's
// model.safetensors.
func editTensor(t *testing.T, dir, name string, edit func([]byte)) {
	t.Helper()
	path := filepath.Join(dir, "model.safetensors")
	h, err := safetensors.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	e, ok := h.Tensors[name]
	if !ok {
		t.Fatalf("no tensor %s", name)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	edit(raw[h.DataOffset+e.Begin : h.DataOffset+e.End])
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

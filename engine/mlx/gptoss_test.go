package mlx

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestGptOssPlan plans gpt_oss in both layouts: MXFP4 experts as MLX's
// mxfp4 (group 32, 4 bits), dequantized ones in float; sinks and the
// router's, experts' and o_proj's biases are read.
func TestGptOssPlan(t *testing.T) {
	for _, quant := range []string{"", testmodel.QuantMXFP4} {
		c := testmodel.TinyFamily("gpt_oss")
		c.Quant = quant
		cfg, mods, err := plan(writeTiny(t, c))
		if err != nil {
			t.Fatalf("%q: %v", quant, err)
		}
		byName := map[string]module{}
		for _, m := range mods {
			byName[m.Name] = m
		}
		gu := byName["model.layers.1.mlp.experts.gate_up_proj"]
		if gu.Experts != 4 || gu.Out != 2*c.Intermediate || gu.In != c.Hidden || !gu.Bias {
			t.Errorf("%q: gate_up_proj %+v", quant, gu)
		}
		if q := gu.Quant; (quant == "") != (q == nil) || (q != nil && *q != (quantParams{GroupSize: 32, Bits: 4, Mode: "mxfp4"})) {
			t.Errorf("%q: gate_up_proj quantized as %+v", quant, q)
		}
		if s := byName["model.layers.0.self_attn.sinks"]; !s.Bare || s.Out != cfg.Heads {
			t.Errorf("%q: sinks %+v", quant, s)
		}
		if !byName["model.layers.0.self_attn.o_proj"].Bias || !byName["model.layers.0.mlp.router"].Bias {
			t.Errorf("%q: o_proj or router without a bias", quant)
		}
	}
}

// TestGptOssHostileTensors: MXFP4 experts, biases and sinks that
// contradict config.json or MXFP4's layout are refused as
// CheckpointErrors naming the tensor.
func TestGptOssHostileTensors(t *testing.T) {
	const gu = "model.layers.2.mlp.experts.gate_up_proj"
	const down = "model.layers.1.mlp.experts.down_proj"
	type entry struct {
		DType   string `json:"dtype"`
		Shape   []int  `json:"shape"`
		Offsets []int  `json:"data_offsets"`
	}
	for _, c := range []struct {
		name, tensor string
		float        bool
		edit         func(h map[string]*entry)
	}{
		{"blocks reshaped", gu + "_blocks", false, func(h map[string]*entry) {
			s := h[gu+"_blocks"].Shape
			h[gu+"_blocks"].Shape = []int{s[0], s[1] * 2, s[2], s[3] / 2}
		}},
		{"blocks not bytes", down + "_blocks", false, func(h map[string]*entry) { h[down+"_blocks"].DType = "I8" }},
		{"scales not bytes", gu + "_scales", false, func(h map[string]*entry) { h[gu+"_scales"].DType = "I8" }},
		{"scales missing", down + "_scales", false, func(h map[string]*entry) {
			h[down+"_scalez"] = h[down+"_scales"]
			delete(h, down+"_scales")
		}},
		{"scales per 64", gu + "_scales", false, func(h map[string]*entry) {
			s := h[gu+"_scales"].Shape
			h[gu+"_scales"].Shape = []int{s[0], s[1] * 2, s[2] / 2}
		}},
		{"expert bias missing", gu + "_bias", false, func(h map[string]*entry) {
			h[gu+"_biaz"] = h[gu+"_bias"]
			delete(h, gu+"_bias")
		}},
		{"sinks reshaped", "model.layers.0.self_attn.sinks", false, func(h map[string]*entry) {
			n := h["model.layers.0.self_attn.sinks"].Shape[0]
			h["model.layers.0.self_attn.sinks"].Shape = []int{2, n / 2}
		}},
		{"float experts transposed", gu, true, func(h map[string]*entry) {
			s := h[gu].Shape
			h[gu].Shape = []int{s[0], s[2], s[1]}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testmodel.TinyFamily("gpt_oss")
			if !c.float {
				cfg.Quant = testmodel.QuantMXFP4
			}
			dir := writeTiny(t, cfg)
			editHeader(t, filepath.Join(dir, "model.safetensors"), func(raw map[string]json.RawMessage) {
				h := map[string]*entry{}
				for k, v := range raw {
					if k == "__metadata__" {
						continue
					}
					var e entry
					if err := json.Unmarshal(v, &e); err != nil {
						t.Fatal(err)
					}
					h[k] = &e
				}
				c.edit(h)
				for k := range raw {
					if k != "__metadata__" {
						delete(raw, k)
					}
				}
				for k, e := range h {
					raw[k], _ = json.Marshal(e)
				}
			})
			_, _, err := plan(dir)
			var ce *engine.CheckpointError
			if !errors.As(err, &ce) || ce.Tensor != c.tensor {
				t.Errorf("%v, want a CheckpointError naming %s", err, c.tensor)
			}
		})
	}
}

// TestMXFP4OnlyForGptOss: quant_method mxfp4 on another family is
// refused when config.json is read.
func TestMXFP4OnlyForGptOss(t *testing.T) {
	dir := writeTiny(t, testmodel.Tiny())
	editConfig(t, dir, func(m map[string]any) { m["quantization_config"] = map[string]any{"quant_method": "mxfp4"} })
	if _, _, err := plan(dir); !errors.Is(err, engine.ErrBadCheckpoint) || !strings.Contains(err.Error(), "mxfp4") {
		t.Errorf("llama with mxfp4: %v", err)
	}
}

// TestGptOssBadLimit: a swiglu_limit that is not positive is refused.
func TestGptOssBadLimit(t *testing.T) {
	dir := writeTiny(t, testmodel.TinyFamily("gpt_oss"))
	editConfig(t, dir, func(m map[string]any) { m["swiglu_limit"] = -1 })
	if _, _, err := plan(dir); !errors.Is(err, engine.ErrBadCheckpoint) || !strings.Contains(err.Error(), "swiglu_limit") {
		t.Errorf("swiglu_limit -1: %v", err)
	}
}

// editHeader rewrites the safetensors header of path (tensor name → its
// JSON entry), keeping the data.
func editHeader(t *testing.T, path string, edit func(map[string]json.RawMessage)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(b)
	var h map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &h); err != nil {
		t.Fatal(err)
	}
	edit(h)
	hdr, _ := json.Marshal(h)
	out := append(binary.LittleEndian.AppendUint64(nil, uint64(len(hdr))), hdr...)
	if err := os.WriteFile(path, append(out, b[8+n:]...), 0o644); err != nil {
		t.Fatal(err)
	}
}

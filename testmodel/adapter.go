package testmodel

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// Adapter describes a LoRA adapter over a Config's model, with random
// weights: WriteAdapter writes it as PEFT or mlx-lm save adapters, and a
// Config whose Merge is set writes the model with the adapter merged into
// its weights (W + scale·B·A), the checkpoint an adapter's tokens are
// checked against.
type Adapter struct {
	// Rank is r; zero means 8.
	Rank int
	// Alpha is lora_alpha (PEFT); zero means 2·Rank. Scale is Alpha/Rank,
	// or Alpha/sqrt(Rank) with RSLoRA. mlx-lm's files carry the scale.
	Alpha  float64
	RSLoRA bool
	// Targets are the modules adapted, as "self_attn.q_proj"; nil means
	// every projection of the family (the attention only for mixtures of
	// experts).
	Targets []string
	// Layers are the layers adapted; nil means all.
	Layers []int
	// MLX writes mlx-lm's layout (adapters.safetensors, lora_a [in, r]);
	// the default is PEFT's.
	MLX bool
	// DType of the adapter's weights: "float32" (the default), "bfloat16"
	// or "float16".
	DType string
	// Seed selects the random weights.
	Seed int64
}

func (a Adapter) withDefaults(c Config) Adapter {
	if a.Rank == 0 {
		a.Rank = 8
	}
	if a.Alpha == 0 {
		a.Alpha = 2 * float64(a.Rank)
	}
	if a.DType == "" {
		a.DType = "float32"
	}
	if a.Targets == nil {
		a.Targets = AdapterTargets(c.Arch)
	}
	if a.Layers == nil {
		for i := range c.Layers {
			a.Layers = append(a.Layers, i)
		}
	}
	return a
}

// Scale is the multiplier of B·A.
func (a Adapter) Scale() float64 {
	if a.RSLoRA {
		return a.Alpha / math.Sqrt(float64(a.Rank))
	}
	return a.Alpha / float64(a.Rank)
}

// AdapterTargets are the projections of arch an adapter targets by
// default.
func AdapterTargets(arch string) []string {
	switch arch {
	case "phi3":
		return []string{"self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"}
	case "qwen3_moe", "mixtral":
		return []string{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"}
	}
	return []string{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
		"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}
}

// widths is module's [in, out] in c's model.
func (c Config) widths(module string) ([2]int, bool) {
	h, hd := c.Hidden, c.HeadDim()
	q, kv, inter := c.Heads*hd, c.KVHeads*hd, c.Intermediate
	w, ok := map[string][2]int{
		"self_attn.q_proj": {h, q}, "self_attn.k_proj": {h, kv}, "self_attn.v_proj": {h, kv},
		"self_attn.o_proj": {q, h}, "self_attn.qkv_proj": {h, q + 2*kv},
		"mlp.gate_proj": {h, inter}, "mlp.up_proj": {h, inter}, "mlp.gate_up_proj": {h, 2 * inter},
		"mlp.down_proj": {inter, h},
	}[module]
	return w, ok
}

// loraWeights draws the pair of layer's module: A [r, in] and B [out, r],
// rounded to the adapter's dtype. B·A·scale has about half the spread of
// the weight it adds to, so the adapter's tokens differ from the base's.
func (a Adapter) loraWeights(c Config, layer int, module string) (A, B []float32, in, out int) {
	w, _ := c.widths(module)
	in, out = w[0], w[1]
	draw := Config{Seed: a.Seed, DType: a.DType}
	name := fmt.Sprintf("lora.%d.%s.", layer, module)
	A = drawWhole(tensorSpec{name: name + "A", shape: []int{a.Rank, in}, std: 1 / math.Sqrt(float64(in))}, draw)
	// (B·A)_ij sums r products of spread std_B/sqrt(in): spread
	// std_B·sqrt(r/in); half of W's 1/sqrt(in) after the scale.
	stdB := 0.5 / (a.Scale() * math.Sqrt(float64(a.Rank)))
	B = drawWhole(tensorSpec{name: name + "B", shape: []int{out, a.Rank}, std: stdB}, draw)
	return A, B, in, out
}

// WriteAdapter writes adapter a over base's model into dir, as PEFT saves
// an adapter (adapter_config.json, adapter_model.safetensors) or, with
// a.MLX, as mlx-lm does (adapter_config.json, adapters.safetensors).
func WriteAdapter(dir string, base Config, a Adapter) error {
	base, err := base.withDefaults()
	if err != nil {
		return err
	}
	a = a.withDefaults(base)
	if err := a.check(base); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	prefix := families[base.Arch].prefix
	var fts []fileTensor
	var data [][]byte
	dt := dtypeNames[a.DType]
	for _, l := range a.Layers {
		for _, m := range a.Targets {
			A, B, in, out := a.loraWeights(base, l, m)
			p := fmt.Sprintf("%slayers.%d.%s.", prefix, l, m)
			if a.MLX {
				fts = append(fts, fileTensor{p + "lora_a", dt, []int{in, a.Rank}}, fileTensor{p + "lora_b", dt, []int{a.Rank, out}})
				data = append(data, encode(transposed(A, a.Rank, in), a.DType), encode(transposed(B, out, a.Rank), a.DType))
			} else {
				p = "base_model.model." + p
				fts = append(fts, fileTensor{p + "lora_A.weight", dt, []int{a.Rank, in}}, fileTensor{p + "lora_B.weight", dt, []int{out, a.Rank}})
				data = append(data, encode(A, a.DType), encode(B, a.DType))
			}
		}
	}
	file, cfg := "adapter_model.safetensors", peftConfigJSON(base, a)
	if a.MLX {
		file, cfg = "adapters.safetensors", mlxAdapterConfigJSON(base, a)
	}
	if err := writeJSON(filepath.Join(dir, "adapter_config.json"), cfg); err != nil {
		return err
	}
	b := safetensorsHeader(fts)
	for _, d := range data {
		b = append(b, d...)
	}
	return os.WriteFile(filepath.Join(dir, file), b, 0o644)
}

func (a Adapter) check(c Config) error {
	if a.Rank < 1 {
		return fmt.Errorf("%w: adapter rank %d", ErrInvalidConfig, a.Rank)
	}
	if _, ok := dtypeNames[a.DType]; !ok {
		return fmt.Errorf("%w: adapter dtype %q", ErrInvalidConfig, a.DType)
	}
	if IsEncoder(c.Arch) {
		return fmt.Errorf("%w: adapters are written for decoders, not %s", ErrInvalidConfig, c.Arch)
	}
	for _, m := range a.Targets {
		if _, ok := c.widths(m); !ok {
			return fmt.Errorf("%w: adapter target %q", ErrInvalidConfig, m)
		}
	}
	for _, l := range a.Layers {
		if l < 0 || l >= c.Layers {
			return fmt.Errorf("%w: adapter layer %d of %d", ErrInvalidConfig, l, c.Layers)
		}
	}
	return nil
}

func transposed(m []float32, rows, cols int) []float32 {
	out := make([]float32, len(m))
	for r := range rows {
		for c := range cols {
			out[c*rows+r] = m[r*cols+c]
		}
	}
	return out
}

func peftConfigJSON(c Config, a Adapter) map[string]any {
	var mods []string
	for _, t := range a.Targets {
		mods = append(mods, t[strings.IndexByte(t, '.')+1:])
	}
	return map[string]any{
		"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": a.Rank, "lora_alpha": a.Alpha,
		"use_rslora": a.RSLoRA, "use_dora": false, "lora_dropout": 0.0, "bias": "none",
		"fan_in_fan_out": false, "target_modules": mods, "modules_to_save": nil,
		"layers_to_transform": a.Layers, "base_model_name_or_path": c.Arch, "inference_mode": true,
		"rank_pattern": map[string]any{}, "alpha_pattern": map[string]any{},
	}
}

func mlxAdapterConfigJSON(c Config, a Adapter) map[string]any {
	return map[string]any{
		"fine_tune_type": "lora", "num_layers": len(a.Layers), "model": c.Arch,
		"lora_parameters": map[string]any{"rank": a.Rank, "scale": a.Scale(), "dropout": 0.0, "keys": a.Targets},
	}
}

// merged reports whether t is a weight Merge adds to.
func (c Config) merged(t tensorSpec) bool {
	_, _, ok := c.mergeTarget(t)
	return ok
}

func (c Config) mergeTarget(t tensorSpec) (Adapter, [2]any, bool) {
	if c.Merge == nil || len(t.shape) != 2 {
		return Adapter{}, [2]any{}, false
	}
	a := c.Merge.withDefaults(c)
	prefix := families[c.Arch].prefix
	for _, l := range a.Layers {
		for _, m := range a.Targets {
			if t.name == fmt.Sprintf("%slayers.%d.%s.weight", prefix, l, m) {
				return a, [2]any{l, m}, true
			}
		}
	}
	return Adapter{}, [2]any{}, false
}

// merge adds scale·B·A to w (t's values), in float64, rounded to DType.
func (c Config) merge(t tensorSpec, w []float32) []float32 {
	a, lm, ok := c.mergeTarget(t)
	if !ok {
		return w
	}
	A, B, in, out := a.loraWeights(c, lm[0].(int), lm[1].(string))
	s := a.Scale()
	for i := range out {
		for j := range in {
			var d float64
			for k := range a.Rank {
				d += float64(B[i*a.Rank+k]) * float64(A[k*in+j])
			}
			w[i*in+j] = roundTo(float32(float64(w[i*in+j])+s*d), c.DType)
		}
	}
	return w
}

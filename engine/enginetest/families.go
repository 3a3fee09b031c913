package enginetest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/mlxserving/mlxserving/testmodel"
)

// HostileConfig is an edit of one family's own config.json fields that no
// real model has. An engine must refuse the checkpoint with a
// *engine.CheckpointError before reading weights, and go on serving.
type HostileConfig struct {
	Name  string // what is wrong
	Arch  string // the testmodel family it edits
	Key   string // the config.json field (of text_config for a wrapped family)
	Value any    // its new value; nil removes the field
	// Names, when set, is what the refusal's message must name (the
	// field within Value at fault).
	Names string
}

// HostileConfigs lists the edits every engine's tests feed it.
func HostileConfigs() []HostileConfig {
	return []HostileConfig{
		{"more experts a token than experts", "qwen3_moe", "num_experts_per_tok", 9, ""},
		{"a million experts", "qwen3_moe", "num_experts", 1 << 20, ""},
		{"negative window", "gemma3_text", "sliding_window", -5, ""},
		{"layer_types too short", "gemma3_text", "layer_types", []string{"full_attention"}, ""},
		{"unknown layer type", "gemma3_text", "layer_types", []string{"x", "x", "x", "x"}, ""},
		{"rotary factor above 1", "phi3", "partial_rotary_factor", 2.0, ""},
		{"longrope factors of the wrong length", "phi3", "rope_scaling",
			map[string]any{"type": "longrope", "short_factor": []float64{1}, "long_factor": []float64{1}}, ""},
		{"text_config not an object", "gemma3", "text_config", "gemma", ""},
		{"soft-cap not a number", "gemma2", "attn_logit_softcapping", "x", ""},
		{"query scalar not positive", "gemma2", "query_pre_attn_scalar", -1, ""},
		{"yarn factor below 1", "qwen3", "rope_scaling", map[string]any{"rope_type": "yarn", "factor": 0.5}, "factor"},
		{"yarn without a factor", "qwen3", "rope_scaling",
			map[string]any{"rope_type": "yarn", "original_max_position_embeddings": 32}, "factor"},
		{"yarn beta_fast below beta_slow", "llama", "rope_scaling",
			map[string]any{"type": "yarn", "factor": 4.0, "beta_fast": 1.0, "beta_slow": 32.0}, "beta_fast"},
		{"yarn original context not positive", "llama", "rope_scaling",
			map[string]any{"type": "yarn", "factor": 4.0, "original_max_position_embeddings": -8}, "original_max_position_embeddings"},
		{"yarn truncate not a boolean", "qwen3", "rope_scaling",
			map[string]any{"rope_type": "yarn", "factor": 4.0, "truncate": "no"}, "truncate"},
	}
}

// Write writes testmodel.TinyFamily(h.Arch) into dir with the edit made.
func (h HostileConfig) Write(dir string) error {
	if err := testmodel.Write(dir, testmodel.TinyFamily(h.Arch)); err != nil {
		return err
	}
	path := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var c map[string]any
	if err := json.Unmarshal(raw, &c); err != nil {
		return err
	}
	target := c
	if text, ok := c["text_config"].(map[string]any); ok && h.Key != "text_config" {
		target = text
	}
	if h.Value == nil {
		delete(target, h.Key)
	} else {
		target[h.Key] = h.Value
	}
	if raw, err = json.Marshal(c); err != nil {
		return err
	}
	return os.WriteFile(path, raw, 0o644)
}

// HostileQuant is an edit of a quantized checkpoint's quantization_config
// that asks for a layout an engine here does not run (or no real
// checkpoint has). An engine must refuse it with a *engine.CheckpointError
// whose message names Key, and go on serving, unless it is one of Served.
type HostileQuant struct {
	Name  string // what is wrong
	Quant string // the testmodel layout it edits (testmodel.AllQuants)
	Key   string // the quantization_config field
	Value any    // its new value
	// Served names the engines (engine.Engine.Name) that serve the edited
	// layout; their tests skip the edit. Empty: every engine refuses it.
	Served []string
}

// HostileQuantConfigs lists the quantization_config edits engines that
// load quantized checkpoints are fed.
func HostileQuantConfigs() []HostileQuant {
	return []HostileQuant{
		{"an unknown method", testmodel.QuantFP8Block, "quant_method", "bitsandbytes", nil},
		{"fp8 of another format", testmodel.QuantFP8Block, "fmt", "e5m2", nil},
		{"blocks not a multiple of 16", testmodel.QuantFP8Block, "weight_block_size", []int{100, 128}, nil},
		{"compressed-tensors packing FP8", testmodel.QuantFP8Channel, "format", "pack-quantized", nil},
		{"8-bit AWQ", testmodel.QuantAWQ, "bits", 8, nil},
		{"AWQ GEMV packing", testmodel.QuantAWQ, "version", "gemv", nil},
		{"AWQ without zero points", testmodel.QuantAWQ, "zero_point", false, nil},
		{"GPTQ groups of 96", testmodel.QuantGPTQ, "group_size", 96, nil},
		{"GPTQ per-column", testmodel.QuantGPTQ, "group_size", -1, nil},
		{"GPTQ Marlin packing", testmodel.QuantGPTQv2, "checkpoint_format", "marlin", nil},
		{"compressed-tensors of mixed formats", testmodel.QuantW4A16, "format", "mixed-precision", nil},
		{"int4 weights with 8-bit activations (W4A8)", testmodel.QuantW4A16, "config_groups", map[string]any{"group_0": map[string]any{
			"targets":           []string{"Linear"},
			"weights":           map[string]any{"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": true, "dynamic": false},
			"input_activations": map[string]any{"num_bits": 8, "type": "int", "strategy": "token", "dynamic": true, "symmetric": true},
		}}, nil},
	}
}

// Write writes testmodel.TinyQuant in h.Quant's layout into dir with the
// edit made.
func (h HostileQuant) Write(dir string) error {
	cfg := testmodel.TinyQuant()
	cfg.Quant = h.Quant
	if err := testmodel.Write(dir, cfg); err != nil {
		return err
	}
	path := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var c map[string]any
	if err := json.Unmarshal(raw, &c); err != nil {
		return err
	}
	q, ok := c["quantization_config"].(map[string]any)
	if !ok {
		return fmt.Errorf("enginetest: %s: no quantization_config", h.Quant)
	}
	q[h.Key] = h.Value
	if raw, err = json.Marshal(c); err != nil {
		return err
	}
	return os.WriteFile(path, raw, 0o644)
}

// YarnConfigs are checkpoints with YaRN rope scaling, keyed by a test
// name, whose original context a prompt of 70 tokens crosses: qwen3 as
// Qwen publishes it (factor 4 over 32 original positions here), and llama
// over 16 with DeepSeek's mscale/mscale_all_dim attention factor, blend
// bounds left unrounded (truncate false) and a narrower beta range.
func YarnConfigs() map[string]testmodel.Config {
	qwen := testmodel.TinyFamily("qwen3")
	qwen.Yarn = &testmodel.Yarn{Factor: 4, OriginalMaxPositionEmbeddings: 32}
	llama := testmodel.Tiny()
	llama.Seed = 7
	llama.Yarn = &testmodel.Yarn{Factor: 8, OriginalMaxPositionEmbeddings: 16, BetaFast: 8, BetaSlow: 0.5,
		Mscale: 1, MscaleAllDim: 0.5, NoTruncate: true}
	return map[string]testmodel.Config{"qwen3-yarn": qwen, "llama-yarn-mscale": llama}
}

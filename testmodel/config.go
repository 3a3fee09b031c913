package testmodel

import (
	"bytes"
	"encoding/json"
	"os"
)

var archNames = map[string][2]string{
	"llama":   {"LlamaForCausalLM", "llama"},
	"mistral": {"MistralForCausalLM", "mistral"},
	"qwen2":   {"Qwen2ForCausalLM", "qwen2"},
}

// modelConfigJSON is config.json as transformers writes it for the
// architecture.
func modelConfigJSON(c Config, tok *tokenizer) map[string]any {
	names := archNames[c.Arch]
	m := map[string]any{
		"architectures":           []string{names[0]},
		"model_type":              names[1],
		"hidden_size":             c.Hidden,
		"intermediate_size":       c.Intermediate,
		"num_hidden_layers":       c.Layers,
		"num_attention_heads":     c.Heads,
		"num_key_value_heads":     c.KVHeads,
		"head_dim":                c.HeadDim(),
		"vocab_size":              c.Vocab,
		"max_position_embeddings": c.ContextLength,
		"rms_norm_eps":            1e-5,
		"rope_theta":              c.RopeTheta,
		"rope_scaling":            nil,
		"tie_word_embeddings":     c.TieEmbeddings,
		"torch_dtype":             c.DType,
		"hidden_act":              "silu",
		"initializer_range":       0.02,
		"bos_token_id":            tok.bos,
		"eos_token_id":            tok.eos,
		"use_cache":               true,
	}
	switch c.Arch {
	case "llama":
		m["attention_bias"] = false
		m["mlp_bias"] = false
		m["attention_dropout"] = 0.0
	case "mistral":
		m["sliding_window"] = nil
	case "qwen2":
		m["rms_norm_eps"] = 1e-6
		m["use_sliding_window"] = false
		m["sliding_window"] = nil
		m["max_window_layers"] = c.Layers
	}
	if s := c.RopeScaling; s != nil {
		m["rope_scaling"] = map[string]any{
			"rope_type":                        "llama3",
			"factor":                           s.Factor,
			"low_freq_factor":                  s.LowFreqFactor,
			"high_freq_factor":                 s.HighFreqFactor,
			"original_max_position_embeddings": s.OriginalMaxPositionEmbeddings,
		}
	}
	return m
}

func generationConfigJSON(tok *tokenizer) map[string]any {
	return map[string]any{
		"bos_token_id": tok.bos,
		"eos_token_id": tok.eos,
		"do_sample":    false,
	}
}

// writeJSON writes v indented, with HTML characters left as they are (chat
// templates hold '<' and '>').
func writeJSON(path string, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

package testmodel

import (
	"bytes"
	"encoding/json"
	"os"
)

// modelConfigJSON is config.json as transformers writes it for the
// architecture.
func modelConfigJSON(c Config, tok *tokenizer) map[string]any {
	fam := families[c.Arch]
	m := map[string]any{
		"architectures":           []string{fam.class},
		"model_type":              fam.modelType,
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
	fam.config(c, m)
	switch s := c.RopeScaling; {
	case s != nil:
		m["rope_scaling"] = map[string]any{
			"rope_type":                        "llama3",
			"factor":                           s.Factor,
			"low_freq_factor":                  s.LowFreqFactor,
			"high_freq_factor":                 s.HighFreqFactor,
			"original_max_position_embeddings": s.OriginalMaxPositionEmbeddings,
		}
	case c.Yarn != nil:
		m["rope_scaling"] = c.Yarn.rope()
	case c.RopeLinear > 0:
		m["rope_scaling"] = map[string]any{"rope_type": "linear", "factor": c.RopeLinear}
	case c.LongRoPE:
		m["rope_scaling"] = longRoPE(c)
		m["original_max_position_embeddings"] = max(1, c.ContextLength/4)
	}
	if c.TransformersV5 {
		toV5(c, m)
	}
	q := quantizationConfig(c)
	if c.Arch != "gemma3" {
		if q != nil {
			m["quantization_config"] = q
		}
		return m
	}
	// The multimodal checkpoint: the text model's config nested, its
	// special ids, a vision tower's and quantization_config at the top.
	top := map[string]any{
		"architectures":       []string{fam.class},
		"model_type":          "gemma3",
		"text_config":         m,
		"vision_config":       map[string]any{"model_type": "siglip_vision_model", "hidden_size": 16, "image_size": 28, "patch_size": 14, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32},
		"mm_tokens_per_image": 4,
		"boi_token_index":     tok.bos,
		"eoi_token_index":     tok.eos,
		"image_token_index":   c.Vocab - 1,
		"bos_token_id":        tok.bos,
		"eos_token_id":        tok.eos,
		"torch_dtype":         c.DType,
		"tie_word_embeddings": c.TieEmbeddings,
	}
	if q != nil {
		top["quantization_config"] = q
	}
	return top
}

// toV5 rewrites m in transformers 5's names.
func toV5(c Config, m map[string]any) {
	rope := map[string]any{"rope_theta": m["rope_theta"], "rope_type": "default"}
	if s, ok := m["rope_scaling"].(map[string]any); ok {
		for k, v := range s {
			rope[k] = v
		}
		if t, ok := s["type"]; ok {
			delete(rope, "type")
			rope["rope_type"] = t
		}
	}
	if c.Arch == "phi3" {
		rope["partial_rotary_factor"] = m["partial_rotary_factor"]
		delete(m, "partial_rotary_factor")
	}
	if local, ok := m["rope_local_base_freq"]; ok {
		m["rope_parameters"] = map[string]any{
			"full_attention":    rope,
			"sliding_attention": map[string]any{"rope_theta": local, "rope_type": "default"},
		}
		delete(m, "rope_local_base_freq")
	} else {
		m["rope_parameters"] = rope
	}
	delete(m, "rope_theta")
	delete(m, "rope_scaling")
	m["dtype"] = m["torch_dtype"]
	delete(m, "torch_dtype")
	if n, ok := m["num_experts"]; ok {
		m["num_local_experts"] = n
		delete(m, "num_experts")
	}
}

// longRoPE is Phi-3's rope_scaling: a divisor per rotary frequency for
// contexts within the original length (short) and beyond it (long).
func longRoPE(c Config) map[string]any {
	n := c.rotaryDim() / 2
	short, long := make([]float64, n), make([]float64, n)
	for i := range n {
		f := float64(i) / float64(max(1, n-1))
		short[i] = 1 + 0.5*f
		long[i] = 1 + 7*f*f
	}
	return map[string]any{"type": "longrope", "short_factor": short, "long_factor": long}
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

package testmodel

import (
	"fmt"
	"sort"
)

// encoderFamily is a bidirectional encoder: its config.json and weights
// differ from the decoders' throughout, so it writes both itself.
type encoderFamily struct {
	class, maskedLM string // architectures[0] of the bare model and of its masked-LM checkpoint
	modelType       string
	prefix          string // where a masked-LM checkpoint keeps the encoder ("bert.")
	config          func(c Config, tok *tokenizer) map[string]any
	tensors         func(c Config, p string) []tensorSpec
	head            func(c Config) []tensorSpec // the masked-LM head
}

var encoders = map[string]encoderFamily{
	"bert": {class: "BertModel", maskedLM: "BertForMaskedLM", modelType: "bert", prefix: "bert.",
		config: bertConfig, tensors: bertTensors, head: bertHead},
	"modernbert": {class: "ModernBertModel", maskedLM: "ModernBertForMaskedLM", modelType: "modernbert", prefix: "model.",
		config: modernBertConfig, tensors: modernBertTensors, head: modernBertHead},
}

// EncoderArchs lists the encoder architectures Write can produce, sorted:
// models that only embed. Archs lists the generating ones.
func EncoderArchs() []string {
	out := make([]string, 0, len(encoders))
	for a := range encoders {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// IsEncoder reports whether arch is one of EncoderArchs.
func IsEncoder(arch string) bool { _, ok := encoders[arch]; return ok }

// encoderConfigJSON is config.json as transformers writes it for the
// encoder (BertConfig, ModernBertConfig).
func encoderConfigJSON(c Config, tok *tokenizer) map[string]any {
	fam := encoders[c.Arch]
	m := fam.config(c, tok)
	m["architectures"] = []string{fam.class}
	if c.MaskedLM {
		m["architectures"] = []string{fam.maskedLM}
	}
	m["model_type"] = fam.modelType
	m["hidden_size"] = c.Hidden
	m["intermediate_size"] = c.Intermediate
	m["num_hidden_layers"] = c.Layers
	m["num_attention_heads"] = c.Heads
	m["vocab_size"] = c.Vocab
	m["max_position_embeddings"] = c.ContextLength
	m["initializer_range"] = 0.02
	m["torch_dtype"] = c.DType
	if c.TransformersV5 {
		m["dtype"] = c.DType
		delete(m, "torch_dtype")
	}
	return m
}

// bertConfig is BertConfig's fields as bge and all-MiniLM publish them.
func bertConfig(c Config, tok *tokenizer) map[string]any {
	return map[string]any{
		"attention_probs_dropout_prob": 0.1,
		"classifier_dropout":           nil,
		"hidden_act":                   "gelu",
		"hidden_dropout_prob":          0.1,
		"layer_norm_eps":               1e-12,
		"pad_token_id":                 tok.pad,
		"position_embedding_type":      "absolute",
		"type_vocab_size":              2,
		"use_cache":                    true,
	}
}

// modernBertConfig is ModernBertConfig's fields as answerdotai publishes
// them. Layer i attends globally when i % global_attn_every_n_layers is
// 0, else within local_attention/2 positions either side, with its own
// rotary base. Transformers 5 also writes layer_types and rope_parameters
// keyed by layer type, in place of the two rope thetas.
func modernBertConfig(c Config, tok *tokenizer) map[string]any {
	m := map[string]any{
		"attention_bias":             false,
		"attention_dropout":          0.0,
		"bos_token_id":               tok.cls,
		"cls_token_id":               tok.cls,
		"eos_token_id":               tok.sep,
		"sep_token_id":               tok.sep,
		"pad_token_id":               tok.pad,
		"classifier_activation":      "gelu",
		"classifier_bias":            false,
		"classifier_dropout":         0.0,
		"classifier_pooling":         "mean",
		"decoder_bias":               true,
		"deterministic_flash_attn":   false,
		"embedding_dropout":          0.0,
		"global_attn_every_n_layers": c.SlidingPattern,
		"global_rope_theta":          c.RopeTheta,
		"hidden_activation":          "gelu",
		"initializer_cutoff_factor":  2.0,
		"local_attention":            c.SlidingWindow,
		"local_rope_theta":           10000.0,
		"mlp_bias":                   false,
		"mlp_dropout":                0.0,
		"norm_bias":                  false,
		"norm_eps":                   1e-5,
		"position_embedding_type":    "absolute",
		"sparse_prediction":          false,
		"tie_word_embeddings":        true,
	}
	if c.TransformersV5 {
		m["layer_types"] = layerTypes(c.Layers, func(i int) bool { return i%c.SlidingPattern != 0 })
		m["rope_parameters"] = map[string]any{
			"full_attention":    map[string]any{"rope_type": "default", "rope_theta": c.RopeTheta},
			"sliding_attention": map[string]any{"rope_type": "default", "rope_theta": 10000.0},
		}
		delete(m, "global_rope_theta")
		delete(m, "local_rope_theta")
	}
	return m
}

// encoderTensors lists an encoder checkpoint's weights: BertModel's or
// ModernBertModel's save_pretrained names (no prefix, as embedding
// checkpoints publish them), or under the family's prefix with the
// masked-LM head after them.
func encoderTensors(c Config) []tensorSpec {
	fam := encoders[c.Arch]
	if !c.MaskedLM {
		return fam.tensors(c, "")
	}
	return append(fam.tensors(c, fam.prefix), fam.head(c)...)
}

// layerNorm is a LayerNorm's weight (around 1) and, unless noBias, bias.
func layerNorm(name string, n int, noBias bool) []tensorSpec {
	ts := []tensorSpec{{name: name + ".weight", shape: []int{n}, std: 0.1, mean: 1}}
	if !noBias {
		ts = append(ts, tensorSpec{name: name + ".bias", shape: []int{n}, std: 0.1})
	}
	return ts
}

// dense is a Linear layer with a bias.
func dense(name string, out, in int) []tensorSpec {
	return []tensorSpec{lin(name+".weight", out, in), {name: name + ".bias", shape: []int{out}, std: 0.1}}
}

// bertTensors: word, position and token-type embeddings and their
// LayerNorm; post-norm layers (self-attention with biases, then the
// intermediate and output projections); the pooler, which
// sentence-transformers does not use.
func bertTensors(c Config, p string) []tensorSpec {
	h := c.Hidden
	ts := []tensorSpec{
		{name: p + "embeddings.word_embeddings.weight", shape: []int{c.Vocab, h}, std: 1},
		{name: p + "embeddings.position_embeddings.weight", shape: []int{c.ContextLength, h}, std: 0.5},
		{name: p + "embeddings.token_type_embeddings.weight", shape: []int{2, h}, std: 0.5},
	}
	ts = append(ts, layerNorm(p+"embeddings.LayerNorm", h, false)...)
	for i := range c.Layers {
		l := fmt.Sprintf("%sencoder.layer.%d.", p, i)
		for _, n := range []string{"query", "key", "value"} {
			ts = append(ts, dense(l+"attention.self."+n, h, h)...)
		}
		ts = append(ts, dense(l+"attention.output.dense", h, h)...)
		ts = append(ts, layerNorm(l+"attention.output.LayerNorm", h, false)...)
		ts = append(ts, dense(l+"intermediate.dense", c.Intermediate, h)...)
		ts = append(ts, dense(l+"output.dense", h, c.Intermediate)...)
		ts = append(ts, layerNorm(l+"output.LayerNorm", h, false)...)
	}
	return append(ts, dense(p+"pooler.dense", h, h)...)
}

// bertHead is BertForMaskedLM's head (its decoder is the tied word
// embedding; masked-LM checkpoints have no pooler, but keeping it costs
// nothing an engine reads).
func bertHead(c Config) []tensorSpec {
	ts := dense("cls.predictions.transform.dense", c.Hidden, c.Hidden)
	ts = append(ts, layerNorm("cls.predictions.transform.LayerNorm", c.Hidden, false)...)
	return append(ts, tensorSpec{name: "cls.predictions.bias", shape: []int{c.Vocab}, std: 0.1})
}

// modernBertTensors: the token embedding and its norm; pre-norm layers
// (layer 0 has no attn_norm: the embedding norm serves) with fused Wqkv,
// Wo and a GeGLU MLP whose Wi holds the input and gate halves; the final
// norm. No biases: norm_bias and the *_bias fields are false.
func modernBertTensors(c Config, p string) []tensorSpec {
	h := c.Hidden
	ts := []tensorSpec{{name: p + "embeddings.tok_embeddings.weight", shape: []int{c.Vocab, h}, std: 1}}
	ts = append(ts, layerNorm(p+"embeddings.norm", h, true)...)
	for i := range c.Layers {
		l := fmt.Sprintf("%slayers.%d.", p, i)
		if i > 0 {
			ts = append(ts, layerNorm(l+"attn_norm", h, true)...)
		}
		ts = append(ts, lin(l+"attn.Wqkv.weight", 3*h, h), lin(l+"attn.Wo.weight", h, h))
		ts = append(ts, layerNorm(l+"mlp_norm", h, true)...)
		ts = append(ts, lin(l+"mlp.Wi.weight", 2*c.Intermediate, h), lin(l+"mlp.Wo.weight", h, c.Intermediate))
	}
	return append(ts, layerNorm(p+"final_norm", h, true)...)
}

// modernBertHead is ModernBertForMaskedLM's head (its decoder weight is
// the tied embedding).
func modernBertHead(c Config) []tensorSpec {
	ts := []tensorSpec{lin("head.dense.weight", c.Hidden, c.Hidden)}
	ts = append(ts, layerNorm("head.norm", c.Hidden, true)...)
	return append(ts, tensorSpec{name: "decoder.bias", shape: []int{c.Vocab}, std: 0.1})
}

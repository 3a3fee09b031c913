package testmodel

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
)

// family is how one architecture writes its config.json and names its
// weights, as transformers' save_pretrained writes them.
type family struct {
	class     string // architectures[0]
	modelType string
	// config adds the family's own fields to the common ones (m is the
	// text model's config; for a wrapped family it is text_config).
	config func(c Config, m map[string]any)
	// layer appends the weights of decoder layer i under prefix p
	// ("model.layers.3.").
	layer func(c Config, i int, p string, ts []tensorSpec) []tensorSpec
	// prefix is where the language model's weights live ("model.").
	prefix string
	// torchOnly marks a family only the torch engine serves so far:
	// TorchArchs lists it, Archs does not.
	torchOnly bool
}

var families = map[string]family{
	"llama":     {class: "LlamaForCausalLM", modelType: "llama", config: llamaConfig, layer: denseLayer, prefix: "model."},
	"mistral":   {class: "MistralForCausalLM", modelType: "mistral", config: mistralConfig, layer: denseLayer, prefix: "model."},
	"qwen2":     {class: "Qwen2ForCausalLM", modelType: "qwen2", config: qwen2Config, layer: denseLayer, prefix: "model."},
	"qwen3":     {class: "Qwen3ForCausalLM", modelType: "qwen3", config: qwen3Config, layer: denseLayer, prefix: "model."},
	"qwen3_moe": {class: "Qwen3MoeForCausalLM", modelType: "qwen3_moe", config: qwen3MoEConfig, layer: qwen3MoELayer, prefix: "model."},
	"mixtral":   {class: "MixtralForCausalLM", modelType: "mixtral", config: mixtralConfig, layer: mixtralLayer, prefix: "model."},
	"gemma2":    {class: "Gemma2ForCausalLM", modelType: "gemma2", config: gemma2Config, layer: gemmaLayer, prefix: "model."},
	"gemma3_text": {class: "Gemma3ForCausalLM", modelType: "gemma3_text", config: gemma3Config, layer: gemmaLayer,
		prefix: "model."},
	// gemma3 is the multimodal checkpoint: the text model's config under
	// text_config and its weights under language_model.model., beside a
	// vision tower the text engines leave alone.
	"gemma3": {class: "Gemma3ForConditionalGeneration", modelType: "gemma3", config: gemma3Config, layer: gemmaLayer,
		prefix: "language_model.model."},
	"phi3":    {class: "Phi3ForCausalLM", modelType: "phi3", config: phi3Config, layer: phi3Layer, prefix: "model."},
	"olmo2":   {class: "Olmo2ForCausalLM", modelType: "olmo2", config: olmo2Config, layer: olmo2Layer, prefix: "model."},
	"gpt_oss": {class: "GptOssForCausalLM", modelType: "gpt_oss", config: gptOssConfig, layer: gptOssLayer, prefix: "model."},
}

// Archs lists the decoder architectures every engine serves, sorted;
// Write also produces TorchArchs.
func Archs() []string { return archs(false) }

// TorchArchs lists every decoder architecture Write can produce, sorted:
// Archs and those only the torch engine (engine/pyproc) serves so far
// (none now: every family is served by both).
func TorchArchs() []string { return archs(true) }

func archs(torchOnly bool) []string {
	out := make([]string, 0, len(families))
	for a, f := range families {
		if torchOnly || !f.torchOnly {
			out = append(out, a)
		}
	}
	sort.Strings(out)
	return out
}

func llamaConfig(c Config, m map[string]any) {
	m["attention_bias"] = false
	m["mlp_bias"] = false
	m["attention_dropout"] = 0.0
}

func mistralConfig(c Config, m map[string]any) {
	m["sliding_window"] = nullIfZero(c.SlidingWindow)
}

func qwen2Config(c Config, m map[string]any) {
	m["rms_norm_eps"] = 1e-6
	m["use_sliding_window"] = false
	m["sliding_window"] = nil
	m["max_window_layers"] = c.Layers
}

func qwen3Config(c Config, m map[string]any) {
	qwen2Config(c, m)
	m["attention_bias"] = false
}

func qwen3MoEConfig(c Config, m map[string]any) {
	qwen3Config(c, m)
	m["num_experts"] = c.Experts
	m["num_experts_per_tok"] = c.ExpertsPerToken
	m["moe_intermediate_size"] = c.ExpertIntermediate
	m["norm_topk_prob"] = !c.KeepRouterScale
	m["decoder_sparse_step"] = max(1, c.SparseStep)
	m["mlp_only_layers"] = nonNil(c.DenseLayers)
	m["output_router_logits"] = false
	m["router_aux_loss_coef"] = 0.001
}

func mixtralConfig(c Config, m map[string]any) {
	m["num_local_experts"] = c.Experts
	m["num_experts_per_tok"] = c.ExpertsPerToken
	m["sliding_window"] = nullIfZero(c.SlidingWindow)
	m["router_jitter_noise"] = 0.0
	m["output_router_logits"] = false
	m["router_aux_loss_coef"] = 0.02
}

func gemma2Config(c Config, m map[string]any) {
	gemmaCommon(c, m)
	m["attn_logit_softcapping"] = 50.0
	m["final_logit_softcapping"] = 30.0
	// Gemma 2 alternates: even layers slide, odd ones see everything.
	m["layer_types"] = layerTypes(c.Layers, func(i int) bool { return i%2 == 0 })
}

func gemma3Config(c Config, m map[string]any) {
	gemmaCommon(c, m)
	m["model_type"] = "gemma3_text"
	m["architectures"] = []string{"Gemma3ForCausalLM"}
	m["attn_logit_softcapping"] = nil
	m["final_logit_softcapping"] = nil
	m["rope_local_base_freq"] = 10000.0
	pattern := c.SlidingPattern
	if pattern == 0 {
		pattern = 6
	}
	m["sliding_window_pattern"] = pattern
	m["layer_types"] = layerTypes(c.Layers, func(i int) bool { return (i+1)%pattern != 0 })
}

func gemmaCommon(c Config, m map[string]any) {
	delete(m, "hidden_act")
	m["hidden_activation"] = "gelu_pytorch_tanh"
	m["rms_norm_eps"] = 1e-6
	m["query_pre_attn_scalar"] = c.HeadDim()
	m["sliding_window"] = nullIfZero(c.SlidingWindow)
	m["attention_bias"] = false
	m["attention_dropout"] = 0.0
	m["pad_token_id"] = 0
}

func phi3Config(c Config, m map[string]any) {
	m["partial_rotary_factor"] = c.PartialRotary
	m["sliding_window"] = nullIfZero(c.SlidingWindow)
	m["original_max_position_embeddings"] = c.ContextLength
	m["resid_pdrop"], m["embd_pdrop"], m["attention_dropout"] = 0.0, 0.0, 0.0
	m["pad_token_id"] = nil
}

func olmo2Config(c Config, m map[string]any) {
	m["attention_bias"] = false
	m["attention_dropout"] = 0.0
	m["rms_norm_eps"] = 1e-6
	m["pad_token_id"] = nil
}

func layerTypes(n int, sliding func(int) bool) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "full_attention"
		if sliding(i) {
			out[i] = "sliding_attention"
		}
	}
	return out
}

func nullIfZero(n int) any {
	if n == 0 {
		return nil
	}
	return n
}

func nonNil(xs []int) []int {
	if xs == nil {
		return []int{}
	}
	return xs
}

// Weight builders. Linear weights are scaled by 1/sqrt(fan-in) so every
// layer mixes its inputs visibly; norms sit around 1.
func lin(name string, out, in int) tensorSpec {
	return tensorSpec{name: name, shape: []int{out, in}, std: 1 / math.Sqrt(float64(in))}
}

// norm is an RMSNorm weight of size n: around 1, or around 0 for
// families that scale by (1 + w).
func norm(c Config, name string, n int) tensorSpec {
	if isGemma(c.Arch) { // RMSNorm scales by (1 + w)
		return tensorSpec{name: name, shape: []int{n}, std: 0.1}
	}
	return tensorSpec{name: name, shape: []int{n}, std: 0.1, mean: 1}
}

func attention(c Config, p string, ts []tensorSpec) []tensorSpec {
	h, hd := c.Hidden, c.HeadDim()
	ts = append(ts,
		lin(p+"self_attn.q_proj.weight", c.Heads*hd, h),
		lin(p+"self_attn.k_proj.weight", c.KVHeads*hd, h),
		lin(p+"self_attn.v_proj.weight", c.KVHeads*hd, h),
	)
	if c.Arch == "qwen2" {
		ts = append(ts,
			tensorSpec{name: p + "self_attn.q_proj.bias", shape: []int{c.Heads * hd}, std: 0.1},
			tensorSpec{name: p + "self_attn.k_proj.bias", shape: []int{c.KVHeads * hd}, std: 0.1},
			tensorSpec{name: p + "self_attn.v_proj.bias", shape: []int{c.KVHeads * hd}, std: 0.1},
		)
	}
	ts = append(ts, lin(p+"self_attn.o_proj.weight", h, c.Heads*hd))
	switch c.Arch {
	case "qwen3", "qwen3_moe", "gemma3", "gemma3_text": // per-head QK norm
		ts = append(ts, norm(c, p+"self_attn.q_norm.weight", hd), norm(c, p+"self_attn.k_norm.weight", hd))
	}
	return ts
}

func mlp(c Config, p string, inter int, ts []tensorSpec) []tensorSpec {
	return append(ts,
		lin(p+"gate_proj.weight", inter, c.Hidden),
		lin(p+"up_proj.weight", inter, c.Hidden),
		lin(p+"down_proj.weight", c.Hidden, inter),
	)
}

// denseLayer is the Llama layer: pre-norm attention and SwiGLU MLP.
func denseLayer(c Config, i int, p string, ts []tensorSpec) []tensorSpec {
	ts = append(ts, norm(c, p+"input_layernorm.weight", c.Hidden))
	ts = attention(c, p, ts)
	ts = append(ts, norm(c, p+"post_attention_layernorm.weight", c.Hidden))
	return mlp(c, p+"mlp.", c.Intermediate, ts)
}

// gemmaLayer has four norms: before and after attention, before and
// after the MLP.
func gemmaLayer(c Config, i int, p string, ts []tensorSpec) []tensorSpec {
	ts = append(ts, norm(c, p+"input_layernorm.weight", c.Hidden))
	ts = attention(c, p, ts)
	ts = append(ts,
		norm(c, p+"post_attention_layernorm.weight", c.Hidden),
		norm(c, p+"pre_feedforward_layernorm.weight", c.Hidden),
		norm(c, p+"post_feedforward_layernorm.weight", c.Hidden),
	)
	return mlp(c, p+"mlp.", c.Intermediate, ts)
}

// qwen3MoELayer: a router (mlp.gate) over experts (mlp.experts.j.*), or a
// dense MLP on mlp_only_layers and off the sparse step.
func qwen3MoELayer(c Config, i int, p string, ts []tensorSpec) []tensorSpec {
	ts = append(ts, norm(c, p+"input_layernorm.weight", c.Hidden))
	ts = attention(c, p, ts)
	ts = append(ts, norm(c, p+"post_attention_layernorm.weight", c.Hidden))
	step := max(1, c.SparseStep)
	if slices.Contains(c.DenseLayers, i) || (i+1)%step != 0 {
		return mlp(c, p+"mlp.", c.Intermediate, ts)
	}
	ts = append(ts, lin(p+"mlp.gate.weight", c.Experts, c.Hidden))
	for j := range c.Experts {
		ts = mlp(c, fmt.Sprintf("%smlp.experts.%d.", p, j), c.ExpertIntermediate, ts)
	}
	return ts
}

// mixtralLayer: block_sparse_moe with experts w1 (gate), w3 (up), w2 (down).
func mixtralLayer(c Config, i int, p string, ts []tensorSpec) []tensorSpec {
	ts = append(ts, norm(c, p+"input_layernorm.weight", c.Hidden))
	ts = attention(c, p, ts)
	ts = append(ts, norm(c, p+"post_attention_layernorm.weight", c.Hidden))
	ts = append(ts, lin(p+"block_sparse_moe.gate.weight", c.Experts, c.Hidden))
	for j := range c.Experts {
		e := fmt.Sprintf("%sblock_sparse_moe.experts.%d.", p, j)
		ts = append(ts,
			lin(e+"w1.weight", c.Intermediate, c.Hidden),
			lin(e+"w2.weight", c.Hidden, c.Intermediate),
			lin(e+"w3.weight", c.Intermediate, c.Hidden),
		)
	}
	return ts
}

// phi3Layer: fused qkv_proj and gate_up_proj.
func phi3Layer(c Config, i int, p string, ts []tensorSpec) []tensorSpec {
	h, hd := c.Hidden, c.HeadDim()
	return append(ts,
		norm(c, p+"input_layernorm.weight", h),
		lin(p+"self_attn.qkv_proj.weight", (c.Heads+2*c.KVHeads)*hd, h),
		lin(p+"self_attn.o_proj.weight", h, c.Heads*hd),
		norm(c, p+"post_attention_layernorm.weight", h),
		lin(p+"mlp.gate_up_proj.weight", 2*c.Intermediate, h),
		lin(p+"mlp.down_proj.weight", h, c.Intermediate),
	)
}

// olmo2Layer: norms after attention and after the MLP (no input norm),
// QK norm over the whole projection rather than per head.
func olmo2Layer(c Config, i int, p string, ts []tensorSpec) []tensorSpec {
	h, hd := c.Hidden, c.HeadDim()
	ts = append(ts,
		lin(p+"self_attn.q_proj.weight", c.Heads*hd, h),
		lin(p+"self_attn.k_proj.weight", c.KVHeads*hd, h),
		lin(p+"self_attn.v_proj.weight", c.KVHeads*hd, h),
		lin(p+"self_attn.o_proj.weight", h, c.Heads*hd),
		norm(c, p+"self_attn.q_norm.weight", c.Heads*hd),
		norm(c, p+"self_attn.k_norm.weight", c.KVHeads*hd),
		norm(c, p+"post_attention_layernorm.weight", h),
		norm(c, p+"post_feedforward_layernorm.weight", h),
	)
	return mlp(c, p+"mlp.", c.Intermediate, ts)
}

// isGemma reports whether arch is a Gemma family: norms scale by (1 + w)
// and the embedding by sqrt(hidden).
func isGemma(arch string) bool { return strings.HasPrefix(arch, "gemma") }

package testmodel

import (
	"fmt"
	"math"
	"strings"
)

// gpt_oss (OpenAI's gpt-oss-20b and -120b) as GptOssForCausalLM saves it:
// q, k, v and o with biases, a learned attention sink per head
// (self_attn.sinks), layers alternating sliding and full attention
// (layer_types), YaRN rotary scaling, and a mixture of experts in every
// layer: mlp.router (weight and bias) over mlp.experts, whose weights are
// stacked tensors with biases: gate_up_proj [E, hidden, 2·inter] (gate
// and up interleaved: columns 2j and 2j + 1), down_proj [E, inter,
// hidden].

// gptOssExperts are the expert tensors of layer prefix p that QuantMXFP4
// stores as blocks and scales.
var gptOssExperts = []string{"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}

func gptOssConfig(c Config, m map[string]any) {
	m["num_local_experts"] = c.Experts
	m["num_experts_per_tok"] = c.ExpertsPerToken
	m["experts_per_token"] = c.ExpertsPerToken
	m["swiglu_limit"] = c.swigluLimit()
	m["attention_bias"] = true
	m["attention_dropout"] = 0.0
	m["sliding_window"] = nullIfZero(c.SlidingWindow)
	// gpt-oss alternates from its first layer: even layers slide.
	m["layer_types"] = layerTypes(c.Layers, func(i int) bool { return i%2 == 0 })
	m["router_aux_loss_coef"] = 0.9
	m["output_router_logits"] = false
	m["pad_token_id"] = nil
}

// gptOssLayer: biased attention with sinks, and the router and stacked
// experts.
func gptOssLayer(c Config, i int, p string, ts []tensorSpec) []tensorSpec {
	h, hd, a := c.Hidden, c.HeadDim(), p+"self_attn."
	bias := func(name string, shape ...int) tensorSpec { return tensorSpec{name: name, shape: shape, std: 0.1} }
	e, inter := c.Experts, c.Intermediate
	return append(ts,
		norm(c, p+"input_layernorm.weight", h),
		lin(a+"q_proj.weight", c.Heads*hd, h), bias(a+"q_proj.bias", c.Heads*hd),
		lin(a+"k_proj.weight", c.KVHeads*hd, h), bias(a+"k_proj.bias", c.KVHeads*hd),
		lin(a+"v_proj.weight", c.KVHeads*hd, h), bias(a+"v_proj.bias", c.KVHeads*hd),
		lin(a+"o_proj.weight", h, c.Heads*hd), bias(a+"o_proj.bias", h),
		// Sinks of about the scores' size, so some rows give them a
		// visible share.
		tensorSpec{name: a + "sinks", shape: []int{c.Heads}, std: 1},
		norm(c, p+"post_attention_layernorm.weight", h),
		lin(p+"mlp.router.weight", e, h), bias(p+"mlp.router.bias", e),
		tensorSpec{name: p + gptOssExperts[0], shape: []int{e, h, 2 * inter}, std: 1 / math.Sqrt(float64(h))},
		bias(p+"mlp.experts.gate_up_proj_bias", e, 2*inter),
		tensorSpec{name: p + gptOssExperts[1], shape: []int{e, inter, h}, std: 1 / math.Sqrt(float64(inter))},
		bias(p+"mlp.experts.down_proj_bias", e, h),
	)
}

// swigluLimit is swiglu_limit: SwiGLULimit, or gpt-oss's 7.
func (c Config) swigluLimit() float64 {
	if c.SwiGLULimit > 0 {
		return c.SwiGLULimit
	}
	return 7
}

// isMXFP4Expert reports whether t is a gpt_oss expert tensor, the ones
// QuantMXFP4 stores as blocks and scales.
func isMXFP4Expert(t tensorSpec) bool {
	for _, s := range gptOssExperts {
		if strings.HasSuffix(t.name, "."+s) && len(t.shape) == 3 {
			return true
		}
	}
	return false
}

// checkGptOss checks the quantized layout fits the family: gpt_oss takes
// QuantMXFP4 or none, QuantMXFP4 is gpt_oss's alone, and its experts'
// inputs (hidden and inter) are whole blocks of 32.
func (c Config) checkGptOss() error {
	switch {
	case c.Arch == "gpt_oss" && c.Quant != "" && c.Quant != QuantMXFP4:
		return fmt.Errorf("%w: gpt_oss is written float or %s, not %s", ErrInvalidConfig, QuantMXFP4, c.Quant)
	case c.Quant == QuantMXFP4 && c.Arch != "gpt_oss":
		return fmt.Errorf("%w: %s is gpt_oss's layout, not %s's", ErrInvalidConfig, QuantMXFP4, c.Arch)
	case c.Quant == QuantMXFP4 && (c.Hidden%mxfp4Block != 0 || c.Intermediate%mxfp4Block != 0):
		return fmt.Errorf("%w: %s: hidden %d and intermediate %d must be multiples of %d", ErrInvalidConfig,
			QuantMXFP4, c.Hidden, c.Intermediate, mxfp4Block)
	}
	return nil
}

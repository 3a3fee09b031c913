package mlx

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// The architecture table: every model_type the engine serves, each mapped
// from config.json to one model description (arch) that the loader and
// the forward pass read. A family whose checkpoints need more than the
// table's fields has its own file (gemma.go, moe.go, phi3.go, olmo2.go,
// gptoss.go):
// adding a family is an entry here, that file and its test.

// family is one entry of the table.
type family struct {
	// fill sets the family's description and its config.json defaults
	// on c, before the sizes are checked.
	fill func(r *rawConfig, c *modelConfig)
	// tied is tie_word_embeddings when config.json leaves it out.
	tied bool
}

var families = map[string]family{
	"llama":       {},
	"mistral":     {fill: mistralFill},
	"mixtral":     {fill: mixtralFill},
	"qwen2":       {fill: qwen2Fill},
	"qwen3":       {fill: qwen3Fill, tied: true},
	"qwen3_moe":   {fill: qwen3MoEFill},
	"gemma2":      {fill: gemma2Fill, tied: true},
	"gemma3_text": {fill: gemma3Fill, tied: true},
	"phi3":        {fill: phi3Fill},
	"olmo2":       {fill: olmo2Fill},
	"gpt_oss":     {fill: gptOssFill},
}

// wrappers are multimodal model_types whose language model the engine
// serves: config.json's text_config, of the model_type given here.
var wrappers = map[string]string{"gemma3": "gemma3_text"}

// supported lists the model_types the engine loads, sorted.
func supported() string {
	var out []string
	for k := range families {
		out = append(out, k)
	}
	for k := range wrappers {
		out = append(out, k)
	}
	out = append(out, archBERT, archModernBERT)
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// blockKind is where a decoder layer's norms sit.
type blockKind int

const (
	// preNorm (Llama): x + attn(in(x)), then x + mlp(post(x)).
	preNorm blockKind = iota
	// sandwich (Gemma): x + post(attn(in(x))), then x + postFF(mlp(preFF(x))).
	sandwich
	// postNorm (OLMo 2): x + post(attn(x)), then x + postFF(mlp(x)).
	postNorm
)

// arch is the model description beyond the sizes: what differs between
// families, as data.
type arch struct {
	Block       blockKind
	NormPlusOne bool    // norms scale by 1 + weight (Gemma)
	QKNormWhole bool    // q_norm and k_norm span the whole projection, before the head split (OLMo 2); else per head
	Act         string  // MLP activation: silu or gelu_pytorch_tanh
	EmbedScale  float32 // embeddings are multiplied by it (Gemma: sqrt(hidden)); 0: not
	AttnScale   float32 // attention's query scale; 0: 1/sqrt(head_dim)
	AttnCap     float32 // attention logits soft-capped at it, tanh(s/cap)*cap (Gemma 2); 0: not
	FinalCap    float32 // output logits soft-capped likewise; 0: not
	// Window is the sliding window: a query at position i attends keys at
	// j with i-Window < j <= i on the layers Sliding marks. 0: none.
	Window  int
	Sliding []bool
	// LocalRopeTheta is the RoPE base of sliding layers, which rotate
	// without rope_scaling (Gemma 3's rope_local_base_freq); 0: every
	// layer rotates alike.
	LocalRopeTheta float32
	RotaryDim      int  // leading dims of a head RoPE rotates (Phi-3's partial_rotary_factor)
	FusedQKV       bool // the checkpoint stores self_attn.qkv_proj (Phi-3)
	FusedGateUp    bool // and mlp.gate_up_proj, gate rows first
	OBias          bool // o_proj has a bias (gpt-oss)
	// Sinks: every head has a learned logit (self_attn.sinks) that its
	// softmax includes and drops (gpt-oss).
	Sinks bool
	MoE   *moeConfig
	// Prefix is where the language model's tensors live ("model.",
	// "language_model.model." or "model.language_model."), Head its
	// output layer; planModules sets them from the checkpoint's names.
	Prefix, Head string
}

// slides reports whether layer li attends through the sliding window.
func (c *modelConfig) slides(li int) bool {
	return c.Window > 0 && li < len(c.Sliding) && c.Sliding[li]
}

// plainDecode reports whether the fused decode kernels (fused.go) compute
// this architecture's layers: a Llama-shaped layer with whole-head RoPE
// of one kind for every layer and no attention factor on it.
func (c *modelConfig) plainDecode() bool {
	return c.Block == preNorm && !c.QKNorm && !c.NormPlusOne && c.Act == "silu" && c.EmbedScale == 0 &&
		c.AttnScale == 0 && c.AttnCap == 0 && c.FinalCap == 0 && c.RotaryDim == c.HeadDim &&
		c.LocalRopeTheta == 0 && c.Rope.Type != "longrope" && (c.Rope.AttnFactor == 0 || c.Rope.AttnFactor == 1) &&
		c.MoE == nil && !c.Sinks && !c.OBias
}

// describe completes and checks the description once the sizes are known.
func (c *modelConfig) describe(r *rawConfig) string {
	if c.RotaryDim == 0 {
		c.RotaryDim = c.HeadDim
	}
	if len(r.LayerTypes) > 0 { // transformers' per-layer attention kinds win
		if len(r.LayerTypes) != c.Layers {
			return fmt.Sprintf("layer_types lists %d layers, num_hidden_layers is %d", len(r.LayerTypes), c.Layers)
		}
		c.Sliding = make([]bool, c.Layers)
		for i, t := range r.LayerTypes {
			if t != "sliding_attention" && t != "full_attention" {
				return fmt.Sprintf("layer_types[%d] %q: want sliding_attention or full_attention", i, t)
			}
			c.Sliding[i] = t == "sliding_attention"
		}
	}
	if r.QueryPreAttnScalar < 0 {
		return fmt.Sprintf("query_pre_attn_scalar %v must be positive", r.QueryPreAttnScalar)
	}
	for name, raw := range map[string]json.RawMessage{"attn_logit_softcapping": r.AttnSoftcap, "final_logit_softcapping": r.FinalSoftcap} {
		var v *float64
		if len(raw) > 0 && json.Unmarshal(raw, &v) != nil {
			return fmt.Sprintf("%s %s: want a number or null", name, raw)
		}
	}
	if c.Window < 0 {
		return fmt.Sprintf("sliding_window %d must not be negative", c.Window)
	}
	if c.Window > 0 && c.Sliding == nil {
		c.Sliding = make([]bool, c.Layers)
		for i := range c.Sliding {
			c.Sliding[i] = true
		}
	}
	if c.RotaryDim <= 0 || c.RotaryDim > c.HeadDim || c.RotaryDim%2 != 0 {
		return fmt.Sprintf("rotary dimension %d: want an even number in (0, head_dim %d]", c.RotaryDim, c.HeadDim)
	}
	if c.Rope.Type == "longrope" {
		if reason := c.checkLongRoPE(r); reason != "" {
			return reason
		}
	}
	if c.Rope.Type == "yarn" {
		if c.Rope.OriginalMax == 0 {
			c.Rope.OriginalMax = c.ContextLength
		}
		// The served context is the original length times the factor (as
		// vLLM derives it), never less than max_position_embeddings: Qwen's
		// yarn setting serves its 131,072 tokens without editing that too.
		c.ContextLength = max(c.ContextLength, int(float64(c.Rope.OriginalMax)*c.Rope.Factor))
	}
	if c.MoE != nil {
		return c.MoE.check(c)
	}
	return ""
}

// uniformWindow sets every layer to slide over the window of
// sliding_window when config.json sets one (Mistral, Mixtral, Phi-3).
func uniformWindow(r *rawConfig, c *modelConfig) {
	if r.SlidingWindow != nil {
		c.Window = *r.SlidingWindow
	}
}

func mistralFill(r *rawConfig, c *modelConfig) { uniformWindow(r, c) }

// qwen2Fill: q, k and v biases; with use_sliding_window, the layers from
// max_window_layers on slide.
func qwen2Fill(r *rawConfig, c *modelConfig) {
	c.QKVBias = true
	qwenWindow(r, c)
}

func qwen3Fill(r *rawConfig, c *modelConfig) {
	c.QKNorm = true
	qwenWindow(r, c)
}

func qwenWindow(r *rawConfig, c *modelConfig) {
	if !r.UseSlidingWindow || r.SlidingWindow == nil || *r.SlidingWindow <= 0 || r.Layers <= 0 || r.Layers > maxLayers {
		return
	}
	c.Window = *r.SlidingWindow
	c.Sliding = make([]bool, r.Layers)
	for i := range c.Sliding {
		c.Sliding[i] = i >= r.MaxWindowLayers
	}
}

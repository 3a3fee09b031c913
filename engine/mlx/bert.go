package mlx

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/mlxserving/mlxserving/engine"
)

// The encoder families: bidirectional models that only embed, read from
// config.json as transformers' BertModel and ModernBertModel read it.
const (
	archBERT       = "bert"
	archModernBERT = "modernbert"
)

// encoderConfig is what an encoder's forward pass needs beyond the sizes
// modelConfig holds (Layers, Hidden, Heads, HeadDim, Intermediate, Vocab,
// ContextLength).
type encoderConfig struct {
	// LNEps is the LayerNorms' epsilon (layer_norm_eps; ModernBERT's
	// norm_eps).
	LNEps float32
	// TypeVocab is BERT's type_vocab_size: token type 0's embedding is
	// added to every token (inputs carry no type ids).
	TypeVocab int
	// NormBias, AttnBias and MLPBias are ModernBERT's norm_bias,
	// attention_bias and mlp_bias; every BERT LayerNorm and linear has
	// a bias.
	NormBias, AttnBias, MLPBias bool
	// Local marks ModernBERT's local-attention layers, where a token
	// attends only the keys at most Window/2 positions away on either
	// side (local_attention // 2); the others attend the whole input.
	Local  []bool
	Window int
	// GlobalTheta and LocalTheta are ModernBERT's RoPE bases for global
	// and local layers.
	GlobalTheta, LocalTheta float32
	// Prefix is where the encoder's tensors live: "" as BertModel and
	// ModernBertModel save them, "bert." or "model." under a task head
	// (set from the checkpoint's names).
	Prefix string
}

// rawEncoder is config.json as BERT and ModernBERT write it.
type rawEncoder struct {
	ModelType     string          `json:"model_type"`
	Architectures []string        `json:"architectures"`
	Hidden        int             `json:"hidden_size"`
	Intermediate  int             `json:"intermediate_size"`
	Layers        int             `json:"num_hidden_layers"`
	Heads         int             `json:"num_attention_heads"`
	Vocab         int             `json:"vocab_size"`
	MaxPos        int             `json:"max_position_embeddings"`
	BOS           json.RawMessage `json:"bos_token_id"`
	Quantization  map[string]any  `json:"quantization"`
	QuantConfig   map[string]any  `json:"quantization_config"`
	// BERT
	HiddenAct      string   `json:"hidden_act"`
	TypeVocab      *int     `json:"type_vocab_size"`
	LayerNormEps   *float64 `json:"layer_norm_eps"`
	PosType        string   `json:"position_embedding_type"`
	IsDecoder      bool     `json:"is_decoder"`
	CrossAttention bool     `json:"add_cross_attention"`
	// ModernBERT
	HiddenActivation string                    `json:"hidden_activation"`
	NormEps          *float64                  `json:"norm_eps"`
	NormBias         bool                      `json:"norm_bias"`
	AttnBias         bool                      `json:"attention_bias"`
	MLPBias          bool                      `json:"mlp_bias"`
	LocalAttention   *int                      `json:"local_attention"`
	GlobalEvery      *int                      `json:"global_attn_every_n_layers"`
	GlobalTheta      *float64                  `json:"global_rope_theta"`
	LocalTheta       json.RawMessage           `json:"local_rope_theta"`
	LayerTypes       []string                  `json:"layer_types"`
	RopeParameters   map[string]map[string]any `json:"rope_parameters"`
	RopeScaling      map[string]any            `json:"rope_scaling"`
}

// isEncoder reports whether config.json's model_type is an encoder family.
func isEncoder(b []byte) bool {
	var r struct {
		ModelType string `json:"model_type"`
	}
	return json.Unmarshal(b, &r) == nil && (r.ModelType == archBERT || r.ModelType == archModernBERT)
}

// parseEncoder reads an encoder's config.json; a config the forward pass
// cannot run exactly as transformers does is refused with the reason.
func parseEncoder(b []byte) (*modelConfig, string) {
	var r rawEncoder
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, "invalid JSON: " + err.Error()
	}
	c := &modelConfig{Arch: r.ModelType, Layers: r.Layers, Hidden: r.Hidden, Heads: r.Heads, KVHeads: r.Heads,
		Intermediate: r.Intermediate, Vocab: r.Vocab, ContextLength: r.MaxPos, BOS: -1, Enc: &encoderConfig{}}
	switch {
	case c.Layers > maxLayers || c.Hidden > maxHidden || c.Intermediate > 4*maxHidden || c.Heads > maxHeads ||
		c.Vocab > maxVocab || c.ContextLength > maxContext:
		return nil, fmt.Sprintf("sizes beyond any supported model: layers %d, hidden %d, intermediate %d, heads %d, vocab %d, positions %d",
			c.Layers, c.Hidden, c.Intermediate, c.Heads, c.Vocab, c.ContextLength)
	case c.Layers <= 0 || c.Hidden <= 0 || c.Heads <= 0 || c.Intermediate <= 0 || c.Vocab <= 0 || c.ContextLength <= 0:
		return nil, "num_hidden_layers, hidden_size, num_attention_heads, intermediate_size, vocab_size and max_position_embeddings must be positive"
	case c.Hidden%c.Heads != 0:
		return nil, fmt.Sprintf("hidden_size %d is not a multiple of num_attention_heads %d", c.Hidden, c.Heads)
	case r.Quantization != nil || r.QuantConfig != nil:
		return nil, "quantized encoder checkpoints are not supported"
	}
	c.HeadDim = c.Hidden / c.Heads
	var reason string
	if c.BOS, reason = parseBOS(r.BOS); reason != "" {
		return nil, reason
	}
	if r.ModelType == archBERT {
		reason = r.bert(c)
	} else {
		reason = r.modernBERT(c)
	}
	if reason != "" {
		return nil, reason
	}
	return c, ""
}

// positive reads an optional positive number, def when absent.
func positive(name string, v *float64, def float64) (float32, string) {
	if v == nil {
		return float32(def), ""
	}
	if !(*v > 0) || math.IsInf(*v, 0) {
		return 0, fmt.Sprintf("%s %v must be a positive number", name, *v)
	}
	return float32(*v), ""
}

func (r *rawEncoder) bert(c *modelConfig) string {
	e := c.Enc
	switch {
	case r.HiddenAct != "" && r.HiddenAct != "gelu":
		return fmt.Sprintf("unsupported hidden_act %q (BERT: want gelu)", r.HiddenAct)
	case r.PosType != "" && r.PosType != "absolute":
		return fmt.Sprintf("unsupported position_embedding_type %q (want absolute)", r.PosType)
	case r.IsDecoder || r.CrossAttention:
		return "is_decoder and add_cross_attention are not supported: a BERT encoder attends both ways"
	}
	e.TypeVocab = 2 // BertConfig's default
	if r.TypeVocab != nil {
		e.TypeVocab = *r.TypeVocab
	}
	if e.TypeVocab <= 0 || e.TypeVocab > maxVocab {
		return fmt.Sprintf("type_vocab_size %d: want at least 1", e.TypeVocab)
	}
	var reason string
	e.LNEps, reason = positive("layer_norm_eps", r.LayerNormEps, 1e-12)
	e.NormBias, e.AttnBias, e.MLPBias = true, true, true
	return reason
}

func (r *rawEncoder) modernBERT(c *modelConfig) string {
	e := c.Enc
	if r.HiddenActivation != "" && r.HiddenActivation != "gelu" {
		return fmt.Sprintf("unsupported hidden_activation %q (ModernBERT: want gelu)", r.HiddenActivation)
	}
	if c.HeadDim%2 != 0 {
		return fmt.Sprintf("head size %d must be even for rotary embeddings", c.HeadDim)
	}
	var reason string
	if e.LNEps, reason = positive("norm_eps", r.NormEps, 1e-5); reason != "" {
		return reason
	}
	e.NormBias, e.AttnBias, e.MLPBias = r.NormBias, r.AttnBias, r.MLPBias
	e.Window = 128
	if r.LocalAttention != nil {
		e.Window = *r.LocalAttention
	}
	if e.Window < 2 || e.Window > maxContext {
		return fmt.Sprintf("local_attention %d: want a window of at least 2 tokens", e.Window)
	}
	if reason := r.modernLayers(c); reason != "" {
		return reason
	}
	return r.modernRope(e)
}

// modernLayers reads which layers attend locally: layer_types when
// given, else every layer but each global_attn_every_n_layers-th.
func (r *rawEncoder) modernLayers(c *modelConfig) string {
	e := c.Enc
	e.Local = make([]bool, c.Layers)
	if len(r.LayerTypes) > 0 {
		if len(r.LayerTypes) != c.Layers {
			return fmt.Sprintf("layer_types lists %d layers, num_hidden_layers is %d", len(r.LayerTypes), c.Layers)
		}
		for i, t := range r.LayerTypes {
			if t != "sliding_attention" && t != "full_attention" {
				return fmt.Sprintf("layer_types[%d] %q: want sliding_attention or full_attention", i, t)
			}
			e.Local[i] = t == "sliding_attention"
		}
		return ""
	}
	every := 3
	if r.GlobalEvery != nil {
		every = *r.GlobalEvery
	}
	if every <= 0 {
		return fmt.Sprintf("global_attn_every_n_layers %d must be positive", every)
	}
	for i := range e.Local {
		e.Local[i] = i%every != 0
	}
	return ""
}

// modernRope reads the RoPE bases: global_rope_theta and local_rope_theta
// (a null local theta rotates local layers with the global one), or
// transformers 5's rope_parameters keyed by layer type. Scaled RoPE is
// refused.
func (r *rawEncoder) modernRope(e *encoderConfig) string {
	if len(r.RopeScaling) > 0 {
		return fmt.Sprintf("unsupported rope_scaling %v", r.RopeScaling)
	}
	var reason string
	if e.GlobalTheta, reason = positive("global_rope_theta", r.GlobalTheta, 160000); reason != "" {
		return reason
	}
	switch s := string(r.LocalTheta); s {
	case "":
		e.LocalTheta = 10000
	case "null":
		e.LocalTheta = e.GlobalTheta
	default:
		var v float64
		if err := json.Unmarshal(r.LocalTheta, &v); err != nil {
			return "local_rope_theta: want a number or null"
		}
		if e.LocalTheta, reason = positive("local_rope_theta", &v, 0); reason != "" {
			return reason
		}
	}
	for kind, p := range r.RopeParameters {
		if t, _ := p["rope_type"].(string); t != "" && t != "default" {
			return fmt.Sprintf("rope_parameters[%s]: unsupported rope_type %q", kind, t)
		}
		theta, ok := p["rope_theta"].(float64)
		if !ok {
			continue
		}
		v, reason := positive("rope_parameters["+kind+"].rope_theta", &theta, 0)
		if reason != "" {
			return reason
		}
		switch kind {
		case "full_attention":
			e.GlobalTheta = v
		case "sliding_attention":
			e.LocalTheta = v
		default:
			return fmt.Sprintf("rope_parameters: unknown layer type %q", kind)
		}
	}
	return ""
}

// encoderPrefixes are where checkpoints keep an encoder, by family: the
// bare model first, then under a task head (BertForMaskedLM's "bert.",
// ModernBertForMaskedLM's "model.").
var encoderPrefixes = map[string][]string{
	archBERT:       {"", "bert."},
	archModernBERT: {"", "model."},
}

// encoderEmbedding is the word embedding's name under a prefix.
func encoderEmbedding(arch string) string {
	if arch == archBERT {
		return "embeddings.word_embeddings"
	}
	return "embeddings.tok_embeddings"
}

// encoderModules lists an encoder's weight-bearing modules, with the
// shapes config.json implies, after locating its prefix. LayerNorms are
// norms (In 0) with Bias set when they have a bias (planEncoder checks
// it).
func encoderModules(c *modelConfig, man map[string]tensorInfo) []module {
	e := c.Enc
	e.Prefix = ""
	for _, p := range encoderPrefixes[c.Arch] {
		if _, ok := man[p+encoderEmbedding(c.Arch)+".weight"]; ok {
			e.Prefix = p
			break
		}
	}
	p, h := e.Prefix, c.Hidden
	lin := func(name string, out, in int, bias bool) module {
		return module{Name: p + name, Out: out, In: in, Bias: bias}
	}
	norm := func(name string) module { return module{Name: p + name, Out: h, Bias: e.NormBias} }
	if c.Arch == archBERT {
		ms := []module{
			lin("embeddings.word_embeddings", c.Vocab, h, false),
			lin("embeddings.position_embeddings", c.ContextLength, h, false),
			lin("embeddings.token_type_embeddings", e.TypeVocab, h, false),
			norm("embeddings.LayerNorm"),
		}
		for i := range c.Layers {
			l := "encoder.layer." + itoa(i) + "."
			ms = append(ms,
				lin(l+"attention.self.query", h, h, true), lin(l+"attention.self.key", h, h, true),
				lin(l+"attention.self.value", h, h, true), lin(l+"attention.output.dense", h, h, true),
				norm(l+"attention.output.LayerNorm"),
				lin(l+"intermediate.dense", c.Intermediate, h, true), lin(l+"output.dense", h, c.Intermediate, true),
				norm(l+"output.LayerNorm"))
		}
		return ms
	}
	ms := []module{lin("embeddings.tok_embeddings", c.Vocab, h, false), norm("embeddings.norm")}
	for i := range c.Layers {
		l := "layers." + itoa(i) + "."
		if i > 0 { // layer 0's attention norm is the identity
			ms = append(ms, norm(l+"attn_norm"))
		}
		ms = append(ms,
			lin(l+"attn.Wqkv", 3*h, h, e.AttnBias), lin(l+"attn.Wo", h, h, e.AttnBias),
			norm(l+"mlp_norm"),
			lin(l+"mlp.Wi", 2*c.Intermediate, h, e.MLPBias), lin(l+"mlp.Wo", h, c.Intermediate, e.MLPBias))
	}
	return append(ms, norm("final_norm"))
}

// planEncoder checks an encoder's modules against the checkpoint's
// tensors: shapes, float dtypes, and the biases its config implies.
func planEncoder(c *modelConfig, man map[string]tensorInfo) ([]module, error) {
	ms := encoderModules(c, man)
	for i := range ms {
		m := &ms[i]
		if err := checkModule(c, m, man); err != nil {
			return nil, err
		}
		if m.Quant != nil {
			return nil, &engine.CheckpointError{Path: man[m.Name+".weight"].File, Tensor: m.Name + ".weight", Reason: "quantized encoder weights are not supported"}
		}
		if m.In == 0 && m.Bias { // a LayerNorm's bias (checkModule checks linears' only)
			name := m.Name + ".bias"
			t, ok := man[name]
			if !ok {
				return nil, &engine.CheckpointError{Path: man[m.Name+".weight"].File, Tensor: name, Reason: "missing"}
			}
			if len(t.Shape) != 1 || t.Shape[0] != m.Out {
				return nil, &engine.CheckpointError{Path: t.File, Tensor: name, Reason: fmt.Sprintf("shape %v contradicts config.json (want [%d])", t.Shape, m.Out)}
			}
			if err := checkFloat(name, t); err != nil {
				return nil, err
			}
		}
	}
	return ms, nil
}

package mlx

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/mlxserving/mlxserving/engine"
)

// modelConfig is what the forward pass needs from config.json: the sizes
// every family has, and the architecture description the family's entry
// in the table of arch.go fills in.
type modelConfig struct {
	Arch          string // model_type of the language model (a table key of arch.go)
	Layers        int
	Hidden        int
	Heads         int
	KVHeads       int
	HeadDim       int
	Intermediate  int
	Vocab         int
	ContextLength int
	NormEps       float32
	RopeTheta     float32
	Rope          ropeScaling
	Tied          bool
	QKVBias       bool
	QKNorm        bool
	BOS           int32
	EOS           []int32
	Quant         *quantConfig
	// HF is a transformers quantized layout (AWQ, GPTQ, FP8) that the
	// engine converts at load (hfquant.go); nil for float and MLX
	// checkpoints. With AWQ and GPTQ, Quant is the MLX affine form they
	// are converted to.
	HF *hfQuant
	// Enc is an encoder's configuration (bert.go), which only embeds;
	// arch is then unused.
	Enc *encoderConfig
	arch
}

// ropeScaling is the rope_scaling entry; Type "" means none.
type ropeScaling struct {
	Type           string
	Factor         float64
	LowFreqFactor  float64
	HighFreqFactor float64
	OriginalMax    int
	// longrope (Phi-3): divisors of each rotary frequency within
	// OriginalMax positions (short) and beyond (long).
	ShortFactor, LongFactor []float64
	// yarn: the turns over OriginalMax positions above which a frequency
	// is kept and below which it is divided by Factor, and whether the
	// blend's bounds are rounded to whole dims (yarn.go).
	BetaFast, BetaSlow float64
	Truncate           bool
	// AttnFactor is longrope's and yarn's factor on the rotated part of
	// queries and keys (1 or 0 for none).
	AttnFactor float64
}

// quantConfig is MLX's "quantization" entry: defaults plus per-module
// overrides keyed by module path ("model.layers.0.mlp.down_proj").
type quantConfig struct {
	GroupSize int
	Bits      int
	Mode      string
	Override  map[string]quantParams
	Skip      map[string]bool // modules explicitly left unquantized
}

type quantParams struct {
	GroupSize, Bits int
	Mode            string // MLX's quantization mode: "" is affine; "mxfp4" (gpt-oss's experts) has no biases
}

// params returns the quantization of module, and false if it is not
// quantized.
func (q *quantConfig) params(module string) (quantParams, bool) {
	if q == nil || q.Skip[module] {
		return quantParams{}, false
	}
	if p, ok := q.Override[module]; ok {
		return p, true
	}
	return quantParams{GroupSize: q.GroupSize, Bits: q.Bits}, true
}

type rawConfig struct {
	Architectures []string       `json:"architectures"`
	ModelType     string         `json:"model_type"`
	Hidden        int            `json:"hidden_size"`
	Intermediate  int            `json:"intermediate_size"`
	Layers        int            `json:"num_hidden_layers"`
	Heads         int            `json:"num_attention_heads"`
	KVHeads       int            `json:"num_key_value_heads"`
	HeadDim       int            `json:"head_dim"`
	Vocab         int            `json:"vocab_size"`
	MaxPos        int            `json:"max_position_embeddings"`
	NormEps       float64        `json:"rms_norm_eps"`
	RopeTheta     float64        `json:"rope_theta"`
	RopeScaling   map[string]any `json:"rope_scaling"`
	// RopeParameters is how transformers 5 writes rope_theta and
	// rope_scaling (fromV5 maps it back).
	RopeParameters map[string]any   `json:"rope_parameters"`
	Tied           *bool            `json:"tie_word_embeddings"`
	AttnBias       bool             `json:"attention_bias"`
	MLPBias        bool             `json:"mlp_bias"`
	HiddenAct      string           `json:"hidden_act"`
	BOS            json.RawMessage  `json:"bos_token_id"`
	EOS            json.RawMessage  `json:"eos_token_id"`
	Quantization   map[string]any   `json:"quantization"`
	QuantConfig    map[string]any   `json:"quantization_config"`
	TextConfig     *json.RawMessage `json:"text_config"`

	// Families' own fields (arch.go and the family files).
	HiddenActivation   string          `json:"hidden_activation"`
	QueryPreAttnScalar float64         `json:"query_pre_attn_scalar"`
	AttnSoftcap        json.RawMessage `json:"attn_logit_softcapping"`
	FinalSoftcap       json.RawMessage `json:"final_logit_softcapping"`
	SlidingWindow      *int            `json:"sliding_window"`
	UseSlidingWindow   bool            `json:"use_sliding_window"`
	MaxWindowLayers    int             `json:"max_window_layers"`
	LayerTypes         []string        `json:"layer_types"`
	SlidingPattern     int             `json:"sliding_window_pattern"`
	RopeLocalBase      float64         `json:"rope_local_base_freq"`
	PartialRotary      float64         `json:"partial_rotary_factor"`
	OriginalMaxPos     int             `json:"original_max_position_embeddings"`
	NumExperts         int             `json:"num_experts"`
	NumLocalExperts    int             `json:"num_local_experts"`
	ExpertsPerToken    int             `json:"num_experts_per_tok"`
	MoEIntermediate    int             `json:"moe_intermediate_size"`
	NormTopKProb       *bool           `json:"norm_topk_prob"`
	SparseStep         int             `json:"decoder_sparse_step"`
	MLPOnlyLayers      []int           `json:"mlp_only_layers"`
	SwiGLULimit        float64         `json:"swiglu_limit"`
}

// readConfig reads and checks dir/config.json.
func readConfig(dir string) (*modelConfig, error) {
	path := filepath.Join(dir, "config.json")
	b, err := readSmall(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, &engine.CheckpointError{Path: path, Reason: "config.json is missing"}
		}
		return nil, &engine.CheckpointError{Path: path, Reason: err.Error()}
	}
	if isEncoder(b) {
		c, reason := parseEncoder(b)
		if reason != "" {
			return nil, &engine.CheckpointError{Path: path, Reason: reason}
		}
		return c, nil
	}
	r, reason := parseRaw(b)
	if reason != "" {
		return nil, &engine.CheckpointError{Path: path, Reason: reason}
	}
	c, reason := r.convert()
	if reason != "" {
		return nil, &engine.CheckpointError{Path: path, Reason: reason}
	}
	if err := c.addGenerationEOS(dir); err != nil {
		return nil, err
	}
	return c, nil
}

// addGenerationEOS adds the end tokens of generation_config.json (chat
// models often list more there than config.json does).
func (c *modelConfig) addGenerationEOS(dir string) error {
	path := filepath.Join(dir, "generation_config.json")
	b, err := readSmall(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return &engine.CheckpointError{Path: path, Reason: err.Error()}
	}
	var g struct {
		EOS json.RawMessage `json:"eos_token_id"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		return &engine.CheckpointError{Path: path, Reason: "invalid JSON: " + err.Error()}
	}
	eos, reason := parseEOS(g.EOS)
	if reason != "" {
		return &engine.CheckpointError{Path: path, Reason: reason}
	}
	for _, t := range eos {
		if !slices.Contains(c.EOS, t) {
			c.EOS = append(c.EOS, t)
		}
	}
	return nil
}

// parseRaw decodes config.json; a multimodal checkpoint's language model
// (gemma3: text_config) comes back as the whole config, with the outer
// fields it leaves out.
func parseRaw(b []byte) (*rawConfig, string) {
	var r rawConfig
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, "invalid JSON: " + err.Error()
	}
	r.fromV5()
	text, ok := wrappers[r.ModelType]
	if !ok || r.TextConfig == nil {
		return &r, ""
	}
	var in rawConfig
	if err := json.Unmarshal(*r.TextConfig, &in); err != nil {
		return nil, "text_config: invalid JSON: " + err.Error()
	}
	in.fromV5()
	in.ModelType, in.Architectures = text, r.Architectures
	if in.Tied == nil {
		in.Tied = r.Tied
	}
	if len(in.BOS) == 0 {
		in.BOS = r.BOS
	}
	if len(in.EOS) == 0 {
		in.EOS = r.EOS
	}
	if in.Quantization == nil && in.QuantConfig == nil {
		in.Quantization, in.QuantConfig = r.Quantization, r.QuantConfig
	}
	return &in, ""
}

func (r *rawConfig) convert() (*modelConfig, string) {
	fam, ok := families[r.ModelType]
	if !ok {
		return nil, fmt.Sprintf("unsupported architecture: model_type %q %v (want one of %s)", r.ModelType, r.Architectures, supported())
	}
	c := &modelConfig{
		Arch: r.ModelType, Layers: r.Layers, Hidden: r.Hidden, Heads: r.Heads, KVHeads: r.KVHeads,
		HeadDim: r.HeadDim, Intermediate: r.Intermediate, Vocab: r.Vocab, ContextLength: r.MaxPos,
		NormEps: float32(r.NormEps), RopeTheta: float32(r.RopeTheta),
		QKVBias: r.AttnBias, Tied: r.Tied != nil && *r.Tied, BOS: -1,
	}
	c.Act = "silu"
	if r.HiddenAct != "" {
		c.Act = r.HiddenAct
	}
	if fam.fill != nil {
		fam.fill(r, c)
	}
	if r.Tied == nil {
		c.Tied = fam.tied // transformers' default: tied for Qwen3 and Gemma
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 && c.Heads > 0 {
		c.HeadDim = c.Hidden / c.Heads
	}
	if c.NormEps == 0 {
		c.NormEps = 1e-6
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 10000
	}
	if reason := c.checkSizes(r); reason != "" {
		return nil, reason
	}
	var reason string
	if c.Rope, reason = parseRopeScaling(r.RopeScaling); reason != "" {
		return nil, reason
	}
	if reason := c.describe(r); reason != "" {
		return nil, reason
	}
	if c.BOS, reason = parseBOS(r.BOS); reason != "" {
		return nil, reason
	}
	if c.EOS, reason = parseEOS(r.EOS); reason != "" {
		return nil, reason
	}
	q := r.Quantization
	if q == nil {
		q = r.QuantConfig
	}
	switch {
	case q != nil && hfMethod(q):
		if c.HF, reason = parseHFQuant(q); reason != "" {
			return nil, reason
		}
		if c.HF.Method == "mxfp4" && (c.MoE == nil || !c.MoE.Stacked) {
			return nil, fmt.Sprintf("quantization_config.quant_method mxfp4: unsupported for %s (gpt_oss's experts only)", c.Arch)
		}
		if c.HF.Method != "fp8" && c.HF.Method != "mxfp4" {
			c.Quant = &quantConfig{GroupSize: c.HF.Group, Bits: 4, Mode: "affine", Override: map[string]quantParams{}, Skip: map[string]bool{}}
		}
	case q != nil:
		if c.Quant, reason = parseQuant(q); reason != "" {
			return nil, reason
		}
	}
	return c, ""
}

// maxConfigBytes bounds config.json and generation_config.json.
const maxConfigBytes = 4 << 20

// readSmall reads a JSON side file of at most maxConfigBytes.
func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxConfigBytes {
		return nil, fmt.Errorf("larger than %d bytes", maxConfigBytes)
	}
	return b, nil
}

// Upper bounds on config sizes, far above any real model, so a crafted
// config cannot make later size arithmetic overflow or ask for absurd KV
// memory before the weights' shapes are compared with it.
const (
	maxLayers  = 1 << 10
	maxHidden  = 1 << 17
	maxHeads   = 1 << 10
	maxVocab   = 1 << 22
	maxContext = 1 << 24
)

func (c *modelConfig) checkSizes(r *rawConfig) string {
	switch {
	case c.Layers > maxLayers || c.Hidden > maxHidden || c.Intermediate > 4*maxHidden || c.Heads > maxHeads ||
		c.KVHeads > maxHeads || c.HeadDim > maxHidden || c.Vocab > maxVocab || c.ContextLength > maxContext:
		return fmt.Sprintf("sizes beyond any supported model: layers %d, hidden %d, intermediate %d, heads %d/%d, head_dim %d, vocab %d, context %d",
			c.Layers, c.Hidden, c.Intermediate, c.Heads, c.KVHeads, c.HeadDim, c.Vocab, c.ContextLength)
	case c.Layers <= 0 || c.Hidden <= 0 || c.Heads <= 0 || c.Intermediate <= 0 || c.Vocab <= 0:
		return "num_hidden_layers, hidden_size, num_attention_heads, intermediate_size and vocab_size must be positive"
	case c.KVHeads < 0 || c.Heads%c.KVHeads != 0:
		return fmt.Sprintf("num_attention_heads %d is not a multiple of num_key_value_heads %d", c.Heads, c.KVHeads)
	case c.HeadDim <= 0 || c.HeadDim%2 != 0:
		return fmt.Sprintf("head_dim %d must be positive and even", c.HeadDim)
	case c.ContextLength <= 0:
		return "max_position_embeddings must be positive"
	case c.Act != "silu" && c.Act != "gelu_pytorch_tanh":
		return fmt.Sprintf("unsupported activation %q (want silu or gelu_pytorch_tanh)", c.Act)
	case r.MLPBias:
		return "unsupported mlp_bias: true"
	case r.TextConfig != nil:
		return "unsupported multimodal checkpoint (text_config)"
	}
	return ""
}

func parseRopeScaling(m map[string]any) (ropeScaling, string) {
	if m == nil {
		return ropeScaling{}, ""
	}
	typ, _ := m["rope_type"].(string)
	if typ == "" {
		typ, _ = m["type"].(string)
	}
	num := func(k string) float64 { f, _ := m[k].(float64); return f }
	s := ropeScaling{Type: typ, Factor: num("factor"), LowFreqFactor: num("low_freq_factor"),
		HighFreqFactor: num("high_freq_factor"), OriginalMax: int(num("original_max_position_embeddings"))}
	switch typ {
	case "default":
		return ropeScaling{}, ""
	case "linear":
		if s.Factor <= 0 {
			return s, "rope_scaling linear: factor must be positive"
		}
	case "llama3":
		if s.Factor <= 0 || s.LowFreqFactor <= 0 || s.HighFreqFactor <= s.LowFreqFactor || s.OriginalMax <= 0 {
			return s, fmt.Sprintf("rope_scaling llama3: bad parameters %v", m)
		}
	case "longrope", "su":
		s.Type = "longrope"
		s.ShortFactor, s.LongFactor = floats(m["short_factor"]), floats(m["long_factor"])
		s.AttnFactor = num("attention_factor")
		if s.ShortFactor == nil || s.LongFactor == nil {
			return s, fmt.Sprintf("rope_scaling longrope: want short_factor and long_factor lists, got %v", m)
		}
	case "yarn":
		return parseYarn(m, s)
	default:
		return s, fmt.Sprintf("unsupported rope_scaling type %q (want linear, llama3, yarn or longrope)", typ)
	}
	return s, ""
}

// floats reads a JSON list of numbers, or nil.
func floats(v any) []float64 {
	l, ok := v.([]any)
	if !ok || len(l) == 0 {
		return nil
	}
	out := make([]float64, len(l))
	for i, x := range l {
		f, ok := x.(float64)
		if !ok {
			return nil
		}
		out[i] = f
	}
	return out
}

func parseBOS(raw json.RawMessage) (int32, string) {
	if len(raw) == 0 || string(raw) == "null" {
		return -1, ""
	}
	var v int32
	if err := json.Unmarshal(raw, &v); err != nil {
		return -1, "bos_token_id: " + err.Error()
	}
	return v, ""
}

func parseEOS(raw json.RawMessage) ([]int32, string) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, ""
	}
	var one int32
	if json.Unmarshal(raw, &one) == nil {
		return []int32{one}, ""
	}
	var many []int32
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, "eos_token_id: want an integer or a list of integers"
	}
	return many, ""
}

func parseQuant(q map[string]any) (*quantConfig, string) {
	qc := &quantConfig{Mode: "affine", Override: map[string]quantParams{}, Skip: map[string]bool{}}
	if mode, ok := q["mode"].(string); ok {
		qc.Mode = mode
	}
	if qm, ok := q["quant_method"].(string); ok && qm != "mlx" {
		return nil, fmt.Sprintf("unsupported quantization method %q (want MLX affine)", qm)
	}
	if qc.Mode != "affine" {
		return nil, fmt.Sprintf("unsupported quantization mode %q (want affine)", qc.Mode)
	}
	var reason string
	if qc.GroupSize, qc.Bits, reason = quantSizes(q); reason != "" {
		return nil, reason
	}
	for k, v := range q {
		switch v := v.(type) {
		case bool:
			if !v {
				qc.Skip[k] = true
			}
		case map[string]any:
			gs, bits, reason := quantSizes(v)
			if reason != "" {
				return nil, k + ": " + reason
			}
			qc.Override[k] = quantParams{GroupSize: gs, Bits: bits}
		}
	}
	return qc, ""
}

func quantSizes(m map[string]any) (groupSize, bits int, reason string) {
	gs, _ := m["group_size"].(float64)
	b, _ := m["bits"].(float64)
	if gs != 32 && gs != 64 && gs != 128 {
		return 0, 0, fmt.Sprintf("unsupported quantization group_size %v (want 32, 64 or 128)", m["group_size"])
	}
	if b != 4 && b != 8 && b != 2 && b != 3 && b != 6 || b != math.Trunc(b) {
		return 0, 0, fmt.Sprintf("unsupported quantization bits %v (want 2, 3, 4, 6 or 8)", m["bits"])
	}
	return int(gs), int(b), ""
}

// fromV5 reads transformers 5's rope_parameters into the published
// fields it replaces, where the config does not also have those: a flat
// entry is rope_theta, rope_scaling (when its rope_type is not "default")
// and Phi-3's partial_rotary_factor; an entry keyed by layer type (Gemma
// 3) gives full_attention's as those and sliding_attention's base as
// rope_local_base_freq. num_local_experts stands for qwen3_moe's
// num_experts.
func (r *rawConfig) fromV5() {
	if r.NumExperts == 0 { // transformers 5 names every family's experts so
		r.NumExperts = r.NumLocalExperts
	}
	p := r.RopeParameters
	if p == nil {
		return
	}
	full, keyed := p["full_attention"].(map[string]any)
	if !keyed {
		full = p
	}
	if theta, ok := full["rope_theta"].(float64); ok && r.RopeTheta == 0 {
		r.RopeTheta = theta
	}
	if f, ok := full["partial_rotary_factor"].(float64); ok && r.PartialRotary == 0 {
		r.PartialRotary = f
	}
	if t, _ := full["rope_type"].(string); t != "" && t != "default" && r.RopeScaling == nil {
		r.RopeScaling = map[string]any{}
		for k, v := range full {
			if k != "rope_theta" && k != "partial_rotary_factor" {
				r.RopeScaling[k] = v
			}
		}
	}
	if sliding, ok := p["sliding_attention"].(map[string]any); ok && r.RopeLocalBase == 0 {
		if theta, ok := sliding["rope_theta"].(float64); ok {
			r.RopeLocalBase = theta
		}
	}
}

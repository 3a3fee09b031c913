// Package testmodel writes Hugging Face-layout checkpoints with random
// weights: config.json, model.safetensors, tokenizer.json,
// tokenizer_config.json (with a chat template) and generation_config.json.
// The encoders (EncoderArchs: bert with a WordPiece tokenizer and
// vocab.txt, modernbert) are written as BertModel and ModernBertModel
// save them, and Config.Embedding adds sentence-transformers' files
// (modules.json, 1_Pooling/config.json, sentence_bert_config.json) to any
// checkpoint.
//
// The checkpoints take the same code path as real models in every engine,
// are small enough for CPU tests by default, and are reproducible: the same
// Config (Seed included) always gives byte-identical files.
//
// Use:
//
//	dir := t.TempDir()
//	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
//		t.Fatal(err)
//	}
//	m, err := eng.Load(ctx, engine.ModelSpec{ID: "tiny", Path: dir})
package testmodel

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// ErrInvalidConfig means a Config cannot describe a model: a size is
// missing or inconsistent, or the architecture or dtype is unknown.
var ErrInvalidConfig = errors.New("testmodel: invalid config")

// Config describes the checkpoint to write. Zero fields take the value of
// Tiny(), except Arch ("llama"), DType ("float32"), RopeScaling (none),
// TieEmbeddings (false) and Seed (0, a valid seed).
type Config struct {
	// Arch is the model_type to write: "llama" (the default), "mistral",
	// "qwen2" (q, k and v biases), "qwen3" (per-head QK norm), "qwen3_moe"
	// and "mixtral" (mixtures of experts), "gemma2", "gemma3_text",
	// "gemma3" (the multimodal checkpoint: text_config and
	// language_model.model. weights), "phi3" (fused projections, partial
	// rotary), "olmo2" (post-norms, whole-width QK norm) or "gpt_oss"
	// (biased attention with sinks, experts with biases and a clamped
	// SwiGLU). Archs lists them.
	// The encoders (EncoderArchs) are "bert" (BertModel: post-norm,
	// absolute positions, a WordPiece tokenizer) and "modernbert"
	// (ModernBertModel: pre-norm, rotary, alternating global and local
	// attention, a BPE tokenizer adding [CLS] and [SEP]); they take
	// KVHeads equal to Heads.
	Arch string
	// Layers is the number of decoder layers.
	Layers int
	// Hidden is the model width.
	Hidden int
	// Heads is the number of attention heads; it divides Hidden.
	Heads int
	// KVHeads is the number of key/value heads; it divides Heads.
	KVHeads int
	// Intermediate is the MLP width.
	Intermediate int
	// Vocab is the number of rows of the embedding. The tokenizer holds
	// 256 byte tokens, some merges and 5 special tokens, all below Vocab;
	// the ids past them are filler words: each decodes to text of its
	// own, and no text encodes to them.
	Vocab int
	// ContextLength is max_position_embeddings.
	ContextLength int
	// RopeTheta is the RoPE base; zero means 10000.
	RopeTheta float64
	// RopeScaling, when set, writes llama3-style rope scaling.
	RopeScaling *RopeScaling
	// TieEmbeddings shares the embedding with the output head (no
	// lm_head.weight tensor).
	TieEmbeddings bool
	// DType is the weights' dtype: "float32" (the default), "bfloat16" or
	// "float16".
	DType string
	// Seed selects the random weights.
	Seed int64

	// HeadSize is head_dim when it is not Hidden/Heads (Gemma, Qwen3);
	// zero means Hidden/Heads.
	HeadSize int
	// SlidingWindow is sliding_window: the number of positions a sliding
	// layer attends to (Mistral: every layer; Gemma 2: even layers; Gemma
	// 3: all but every SlidingPattern-th). Zero writes null (Gemma: 4096
	// for gemma2, 512 for gemma3). For modernbert it is local_attention:
	// a local layer's token sees SlidingWindow/2 positions either side
	// (zero: 128).
	SlidingWindow int
	// SlidingPattern is Gemma 3's sliding_window_pattern: every
	// SlidingPattern-th layer is global. Zero means 6. For modernbert it
	// is global_attn_every_n_layers: layer i is global when
	// i % SlidingPattern is 0 (zero: 3). RopeTheta is then
	// global_rope_theta; local_rope_theta is 10000.
	SlidingPattern int
	// RopeLinear, when positive, writes linear rope scaling of that factor
	// (Gemma 3 4B and up: global layers only).
	RopeLinear float64
	// LongRoPE writes Phi-3's longrope scaling: short and long factors per
	// rotary frequency, original_max_position_embeddings a quarter of
	// ContextLength.
	LongRoPE bool
	// Yarn, when set, writes YaRN rope scaling (rope_type "yarn").
	Yarn *Yarn
	// PartialRotary is Phi-3's partial_rotary_factor: the fraction of
	// each head that is rotated. Zero means 1 (phi3 only).
	PartialRotary float64

	// Experts is the number of experts (qwen3_moe, mixtral; zero: 4).
	Experts int
	// ExpertsPerToken is top-k of the router (zero: 2).
	ExpertsPerToken int
	// ExpertIntermediate is qwen3_moe's moe_intermediate_size (zero:
	// Intermediate/2). Mixtral's experts use Intermediate.
	ExpertIntermediate int
	// KeepRouterScale writes norm_topk_prob false (qwen3_moe): the top-k
	// router weights are not renormalised.
	KeepRouterScale bool
	// SparseStep is qwen3_moe's decoder_sparse_step (zero: 1, every layer).
	SparseStep int
	// DenseLayers is qwen3_moe's mlp_only_layers.
	DenseLayers []int
	// SwiGLULimit is gpt_oss's swiglu_limit: the experts' gate is
	// clamped to at most it and up to ±it. Zero means 7, gpt-oss's.
	SwiGLULimit float64

	// TransformersV5 writes config.json as transformers 5 saves it, not
	// as the published checkpoints have it: rope_parameters (keyed by
	// layer type for Gemma 3, with Phi-3's partial_rotary_factor) in
	// place of rope_theta and rope_scaling, dtype for torch_dtype, and
	// num_local_experts for qwen3_moe's num_experts.
	TransformersV5 bool

	// BaseModel writes a decoder's weights as its bare model class saves
	// them (Qwen3Model): no "model." prefix and no lm_head, as embedding
	// checkpoints publish them (Qwen3-Embedding). Not for gemma3.
	BaseModel bool
	// MaskedLM writes an encoder as its masked-language-model checkpoint
	// (BertForMaskedLM: weights under "bert." and a "cls." head;
	// ModernBertForMaskedLM: "model." and a "head." head). Without it an
	// encoder is written as the bare model (BertModel, ModernBertModel),
	// as sentence-transformers checkpoints publish them.
	MaskedLM bool
	// Embedding, when set, writes sentence-transformers' files (see
	// Embedding).
	Embedding *Embedding
	// Quant, when set, writes the decoder layers' linear weights in a
	// published quantized layout (QuantFP8Block, QuantFP8Channel,
	// QuantAWQ, QuantGPTQ, QuantGPTQActOrder, QuantGPTQv2, QuantW4A16,
	// QuantW4A16Asym; see AllQuants) with config.json's
	// quantization_config, quantized from the weights the same Config
	// without Quant writes. The 4-bit layouts need every linear input a
	// multiple of 128 and every output a multiple of 8 (TinyQuant).
	Quant string
	// Merge, when set, writes the model with the adapter merged into its
	// weights: W + scale·B·A for every projection the adapter targets,
	// the adapter's values being those WriteAdapter writes for this
	// Config without Merge.
	Merge *Adapter
}

// RopeScaling is llama3-style RoPE frequency scaling.
type RopeScaling struct {
	Factor                        float64
	LowFreqFactor                 float64
	HighFreqFactor                float64
	OriginalMaxPositionEmbeddings int
}

// Yarn is YaRN RoPE scaling (arXiv 2309.00071) as config.json spells it.
// Zero fields are left out of rope_scaling, so transformers' defaults
// apply: original_max_position_embeddings from max_position_embeddings,
// beta_fast 32, beta_slow 1, the attention factor 0.1·ln(Factor) + 1.
type Yarn struct {
	Factor                        float64
	OriginalMaxPositionEmbeddings int
	BetaFast, BetaSlow            float64
	// Mscale and MscaleAllDim (DeepSeek's), both set, make the attention
	// factor the ratio of 0.1·m·ln(Factor) + 1 for the two.
	Mscale, MscaleAllDim float64
	// AttentionFactor, when positive, is written as attention_factor.
	AttentionFactor float64
	// NoTruncate writes truncate: false (the blend's bounds are not
	// rounded to whole dimensions).
	NoTruncate bool
}

// rope is y as config.json's rope_scaling.
func (y *Yarn) rope() map[string]any {
	m := map[string]any{"rope_type": "yarn", "factor": y.Factor}
	for k, v := range map[string]float64{"beta_fast": y.BetaFast, "beta_slow": y.BetaSlow,
		"mscale": y.Mscale, "mscale_all_dim": y.MscaleAllDim, "attention_factor": y.AttentionFactor} {
		if v != 0 {
			m[k] = v
		}
	}
	if y.OriginalMaxPositionEmbeddings > 0 {
		m["original_max_position_embeddings"] = y.OriginalMaxPositionEmbeddings
	}
	if y.NoTruncate {
		m["truncate"] = false
	}
	return m
}

// Tiny is the default test model: 2 layers, hidden size 64, 4 heads over 2
// key/value heads (grouped-query attention), MLP width 128, a 384-token
// vocabulary, a 512-token context, float32 weights.
func Tiny() Config {
	return Config{
		Arch:          "llama",
		Layers:        2,
		Hidden:        64,
		Heads:         4,
		KVHeads:       2,
		Intermediate:  128,
		Vocab:         384,
		ContextLength: 512,
		RopeTheta:     10000,
		DType:         "float32",
	}
}

// Llama1B is shaped like Llama-3.2-1B: 16 layers, hidden size 2048, 32
// heads over 8 key/value heads, MLP width 8192, vocabulary 128256, tied
// embeddings, llama3 rope scaling, bfloat16 weights (about 2.5 GB).
func Llama1B() Config {
	return Config{
		Arch:          "llama",
		Layers:        16,
		Hidden:        2048,
		Heads:         32,
		KVHeads:       8,
		Intermediate:  8192,
		Vocab:         128256,
		ContextLength: 131072,
		RopeTheta:     500000,
		RopeScaling: &RopeScaling{
			Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4,
			OriginalMaxPositionEmbeddings: 8192,
		},
		TieEmbeddings: true,
		DType:         "bfloat16",
	}
}

// Llama8B is shaped like Llama-3.1-8B: 32 layers, hidden size 4096, 32
// query and 8 KV heads, intermediate size 14336, a 128,256-token vocabulary,
// untied embeddings, a 131,072-token context with Llama 3.1's RoPE scaling,
// bfloat16. Its weights take about 16 GB: for GPU benchmarks only.
func Llama8B() Config {
	c := Llama1B()
	c.Layers, c.Hidden, c.Intermediate = 32, 4096, 14336
	c.RopeScaling = &RopeScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}
	c.TieEmbeddings = false
	return c
}

// Llama70B is shaped like Llama-3.1-70B: 80 layers, hidden size 8192, 64
// query and 8 KV heads, intermediate size 28672, Llama 3.1's vocabulary,
// context and RoPE scaling, untied embeddings, bfloat16. Its weights take
// about 141 GB, more than one 80 or 141 GB GPU holds: for tensor-parallel
// benchmarks only.
func Llama70B() Config {
	c := Llama8B()
	c.Layers, c.Hidden, c.Heads, c.Intermediate = 80, 8192, 64, 28672
	return c
}

// Qwen3_32B is shaped like Qwen3-32B: 64 layers, hidden size 5120, 64
// heads of 128 over 8 KV heads, QK norm, intermediate size 25600, a
// 151,936-token vocabulary, a 40,960-token context, untied embeddings,
// bfloat16 (about 66 GB).
func Qwen3_32B() Config {
	return Config{
		Arch: "qwen3", Layers: 64, Hidden: 5120, Heads: 64, KVHeads: 8, HeadSize: 128,
		Intermediate: 25600, Vocab: 151936, ContextLength: 40960, RopeTheta: 1e6, DType: "bfloat16",
	}
}

// Gemma3_12B is shaped like Gemma-3-12B's language model (gemma3_text):
// 48 layers, hidden size 3840, 16 heads of 256 over 8 KV heads, MLP width
// 15360, a 262,208-token vocabulary, a 131,072-token context, five sliding
// layers (window 1024) to one global, linear rope scaling 8 on the global
// layers, tied embeddings, bfloat16 (about 24 GB).
func Gemma3_12B() Config {
	return Config{
		Arch: "gemma3_text", Layers: 48, Hidden: 3840, Heads: 16, KVHeads: 8, HeadSize: 256,
		Intermediate: 15360, Vocab: 262208, ContextLength: 131072, RopeTheta: 1e6, RopeLinear: 8,
		SlidingWindow: 1024, SlidingPattern: 6, TieEmbeddings: true, DType: "bfloat16",
	}
}

// Qwen3_30B_A3B is shaped like Qwen3-30B-A3B: 48 layers, hidden size 2048,
// 32 heads of 128 over 4 KV heads, 128 experts of width 768 with 8 active
// a token, a 151,936-token vocabulary, a 40,960-token context, bfloat16
// (about 61 GB; 3.3B parameters active a token).
func Qwen3_30B_A3B() Config {
	return Config{
		Arch: "qwen3_moe", Layers: 48, Hidden: 2048, Heads: 32, KVHeads: 4, HeadSize: 128,
		Intermediate: 6144, ExpertIntermediate: 768, Experts: 128, ExpertsPerToken: 8,
		Vocab: 151936, ContextLength: 40960, RopeTheta: 1e6, DType: "bfloat16",
	}
}

// Phi4Mini is shaped like Phi-4-mini: 32 layers, hidden size 3072, 24
// heads of 128 over 8 KV heads, three quarters of each head rotated,
// longrope scaling, MLP width 8192, a 200,064-token vocabulary, a
// 131,072-token context, tied embeddings, bfloat16 (about 7.7 GB).
func Phi4Mini() Config {
	return Config{
		Arch: "phi3", Layers: 32, Hidden: 3072, Heads: 24, KVHeads: 8, Intermediate: 8192,
		Vocab: 200064, ContextLength: 131072, PartialRotary: 0.75, LongRoPE: true,
		TieEmbeddings: true, DType: "bfloat16",
	}
}

// Shapes names the real-model shapes this package can write, for benchmark
// flags: "llama1b", "llama8b", "llama70b", "qwen3-32b", "gemma3-12b",
// "qwen3-30b-a3b", "phi4-mini", and the embedding models "bge-base" and
// "qwen3-embedding-0.6b".
func Shapes() map[string]func() Config {
	return map[string]func() Config{
		"llama1b": Llama1B, "llama8b": Llama8B, "llama70b": Llama70B, "qwen3-32b": Qwen3_32B, "gemma3-12b": Gemma3_12B,
		"qwen3-30b-a3b": Qwen3_30B_A3B, "phi4-mini": Phi4Mini,
		"bge-base": BGEBase, "qwen3-embedding-0.6b": Qwen3Embedding06B,
	}
}

// TinyFamily is Tiny in the layout of arch, sized so a CPU test reaches
// the family's own paths: sliding windows of 16 positions (every other
// layer global for Gemma 3), 4 experts with 2 active, heads of 32 for the
// families whose head_dim is not Hidden/Heads, half of each head rotated
// and longrope for phi3, gpt_oss as published in miniature (4 layers
// alternating, heads of 64, yarn over 64 original positions, truncate
// false, a SwiGLU limit of 1.5 the gates cross). Seed differs per family. The Gemma families keep
// an untied head: with random weights a tied one mostly repeats the last
// token, and greedy tokens would then prove little. The encoders have
// KVHeads equal to Heads; modernbert has 3 layers, global ones at 0 and
// 2, and a local window of 16 (8 positions either side).
func TinyFamily(arch string) Config {
	c := Tiny()
	c.Arch = arch
	c.Seed = int64(len(arch))
	switch arch {
	case "mistral":
		c.SlidingWindow = 16
	case "qwen3":
		c.HeadSize = 32
	case "qwen3_moe":
		c.HeadSize, c.Layers, c.SparseStep, c.DenseLayers = 32, 3, 1, []int{1}
	case "mixtral":
		c.SlidingWindow = 16
	case "gemma2":
		c.HeadSize, c.SlidingWindow = 32, 16
	case "gemma3", "gemma3_text":
		c.HeadSize, c.SlidingWindow, c.SlidingPattern, c.Layers = 32, 16, 2, 4
		c.RopeTheta, c.RopeLinear = 1e6, 8
	case "phi3":
		c.PartialRotary, c.LongRoPE = 0.5, true
	case "bert":
		c.KVHeads = c.Heads
	case "modernbert":
		c.KVHeads, c.Layers, c.SlidingWindow, c.SlidingPattern, c.RopeTheta = c.Heads, 3, 16, 2, 160000
	case "gpt_oss":
		c.HeadSize, c.Layers, c.SlidingWindow, c.RopeTheta = 64, 4, 16, 150000
		c.Yarn = &Yarn{Factor: 8, OriginalMaxPositionEmbeddings: 64, BetaFast: 32, BetaSlow: 1, NoTruncate: true}
		c.SwiGLULimit = 1.5 // within the gates' spread, so the clamp acts
	}
	return c
}

// withDefaults fills zero fields from Tiny and checks the result.
func (c Config) withDefaults() (Config, error) {
	t := Tiny()
	if c.Arch == "" {
		c.Arch = t.Arch
	}
	if c.DType == "" {
		c.DType = t.DType
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = t.RopeTheta
	}
	for _, f := range []struct{ v, d *int }{
		{&c.Layers, &t.Layers}, {&c.Hidden, &t.Hidden}, {&c.Heads, &t.Heads},
		{&c.KVHeads, &t.KVHeads}, {&c.Intermediate, &t.Intermediate},
		{&c.Vocab, &t.Vocab}, {&c.ContextLength, &t.ContextLength},
	} {
		if *f.v == 0 {
			*f.v = *f.d
		}
	}
	c.fillFamilyDefaults()
	if err := c.check(); err != nil {
		return c, err
	}
	return c, c.checkQuant(tensors(c))
}

func (c Config) check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, a...))
	}
	switch {
	case families[c.Arch].class == "" && !IsEncoder(c.Arch):
		return bad("arch %q: want one of %v or %v", c.Arch, TorchArchs(), EncoderArchs())
	case IsEncoder(c.Arch) && c.KVHeads != c.Heads:
		return bad("%s: kv heads %d, want heads (%d)", c.Arch, c.KVHeads, c.Heads)
	case c.Arch == "bert" && c.Vocab < minWordPieceVocab:
		return bad("vocab %d: bert wants at least %d", c.Vocab, minWordPieceVocab)
	case c.BaseModel && (IsEncoder(c.Arch) || c.Arch == "gemma3"):
		return bad("BaseModel is for the text decoders, not %s", c.Arch)
	case c.Quant != "" && IsEncoder(c.Arch):
		return bad("quantized layouts are for the decoders, not %s", c.Arch)
	case c.MaskedLM && !IsEncoder(c.Arch):
		return bad("MaskedLM is for the encoders, not %s", c.Arch)
	case dtypeSize(c.DType) == 0:
		return bad("dtype %q: want float32, bfloat16 or float16", c.DType)
	case c.Layers < 0 || c.Hidden < 0 || c.Heads < 0 || c.KVHeads < 0 ||
		c.Intermediate < 0 || c.Vocab < 0 || c.ContextLength < 0:
		return bad("sizes must not be negative")
	case c.HeadSize == 0 && c.Hidden%c.Heads != 0:
		return bad("hidden %d is not a multiple of heads %d", c.Hidden, c.Heads)
	case c.HeadSize < 0 || c.SlidingWindow < 0 || c.SlidingPattern < 0 || c.RopeLinear < 0 || c.SparseStep < 0:
		return bad("sizes must not be negative")
	case c.isMoE() && (c.Experts <= 0 || c.ExpertsPerToken <= 0 || c.ExpertsPerToken > c.Experts):
		return bad("experts %d, per token %d: want 0 < per token <= experts", c.Experts, c.ExpertsPerToken)
	case c.PartialRotary < 0 || c.PartialRotary > 1:
		return bad("partial rotary factor %v: want 0 < f <= 1", c.PartialRotary)
	case c.Heads%c.KVHeads != 0:
		return bad("heads %d is not a multiple of kv heads %d", c.Heads, c.KVHeads)
	case c.HeadDim()%2 != 0 || c.rotaryDim()%2 != 0:
		return bad("head size %d (rotated %d) must be even for RoPE", c.HeadDim(), c.rotaryDim())
	case c.Vocab < minVocab:
		return bad("vocab %d: want at least %d (256 bytes + %d special tokens)", c.Vocab, minVocab, len(specialTokens))
	case c.RopeTheta < 0:
		return bad("rope theta %v must be positive", c.RopeTheta)
	}
	if c.Merge != nil {
		if err := c.Merge.withDefaults(c).check(c); err != nil {
			return err
		}
	}
	if s := c.RopeScaling; s != nil {
		if s.Factor <= 0 || s.LowFreqFactor <= 0 || s.HighFreqFactor <= s.LowFreqFactor || s.OriginalMaxPositionEmbeddings <= 0 {
			return bad("rope scaling %+v: want factor > 0, 0 < low < high, original positions > 0", *s)
		}
	}
	if y := c.Yarn; y != nil && (y.Factor < 1 || y.OriginalMaxPositionEmbeddings < 0 || y.BetaFast < y.BetaSlow) {
		return bad("yarn %+v: want factor >= 1, original positions >= 0, beta_fast >= beta_slow", *y)
	}
	return nil
}

// HeadDim is the size of one attention head.
func (c Config) HeadDim() int {
	if c.HeadSize > 0 {
		return c.HeadSize
	}
	return c.Hidden / c.Heads
}

// rotaryDim is the part of a head RoPE rotates.
func (c Config) rotaryDim() int {
	if c.PartialRotary > 0 {
		return int(float64(c.HeadDim()) * c.PartialRotary)
	}
	return c.HeadDim()
}

func (c Config) isMoE() bool {
	return c.Arch == "qwen3_moe" || c.Arch == "mixtral" || c.Arch == "gpt_oss"
}

// fillFamilyDefaults sets the zero fields a family needs.
func (c *Config) fillFamilyDefaults() {
	if c.isMoE() {
		if c.Experts == 0 {
			c.Experts = 4
		}
		if c.ExpertsPerToken == 0 {
			c.ExpertsPerToken = 2
		}
		if c.ExpertIntermediate == 0 {
			c.ExpertIntermediate = max(1, c.Intermediate/2)
		}
	}
	switch c.Arch {
	case "gemma2":
		if c.SlidingWindow == 0 {
			c.SlidingWindow = 4096
		}
	case "gemma3", "gemma3_text":
		if c.SlidingWindow == 0 {
			c.SlidingWindow = 512
		}
	case "phi3":
		if c.PartialRotary == 0 {
			c.PartialRotary = 1
		}
	case "modernbert":
		if c.SlidingWindow == 0 {
			c.SlidingWindow = 128
		}
		if c.SlidingPattern == 0 {
			c.SlidingPattern = 3
		}
	}
}

// Write writes the checkpoint described by cfg into dir, creating dir if
// needed. The weights are streamed to disk, so a real-sized model costs
// little memory. Errors wrap ErrInvalidConfig for a bad cfg, or are I/O
// errors.
func Write(dir string, cfg Config) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var files []struct {
		name string
		v    any
	}
	add := func(name string, v any) {
		files = append(files, struct {
			name string
			v    any
		}{name, v})
	}
	switch cfg.Arch {
	case "bert":
		tok := buildWordPiece(cfg.Vocab)
		add("config.json", encoderConfigJSON(cfg, tok))
		add("tokenizer.json", tok.json())
		add("tokenizer_config.json", tok.configJSON(cfg.ContextLength))
		if err := os.WriteFile(filepath.Join(dir, "vocab.txt"), tok.vocabTxt(), 0o644); err != nil {
			return err
		}
	case "modernbert":
		tok := buildTokenizer(cfg.Vocab, encoderSpecials)
		add("config.json", encoderConfigJSON(cfg, tok))
		add("tokenizer.json", tok.json())
		add("tokenizer_config.json", tok.configJSON(cfg.ContextLength))
	default:
		tok := buildTokenizer(cfg.Vocab, specialTokens)
		add("config.json", modelConfigJSON(cfg, tok))
		add("generation_config.json", generationConfigJSON(tok))
		add("tokenizer.json", tok.json())
		add("tokenizer_config.json", tok.configJSON(cfg.ContextLength))
	}
	if e := cfg.Embedding; e != nil && len(e.MatryoshkaDims) > 0 {
		m := files[0].v.(map[string]any)
		if text, ok := m["text_config"].(map[string]any); ok {
			m = text
		}
		m["matryoshka_dimensions"] = e.MatryoshkaDims
	}
	for _, f := range files {
		if err := writeJSON(filepath.Join(dir, f.name), f.v); err != nil {
			return err
		}
	}
	if cfg.Embedding != nil {
		if err := writeSentenceTransformers(dir, cfg); err != nil {
			return err
		}
	}
	return writeWeights(filepath.Join(dir, "model.safetensors"), cfg)
}

// Package testmodel writes Hugging Face-layout checkpoints with random
// weights: config.json, model.safetensors, tokenizer.json,
// tokenizer_config.json (with a chat template) and generation_config.json.
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
	// Arch is "llama" (the default), "mistral" or "qwen2" (adds q, k and v
	// biases).
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
	// rows past the tokenizer are valid ids no text encodes to.
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
}

// RopeScaling is llama3-style RoPE frequency scaling.
type RopeScaling struct {
	Factor                        float64
	LowFreqFactor                 float64
	HighFreqFactor                float64
	OriginalMaxPositionEmbeddings int
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

// Shapes names the real-model shapes this package can write, for benchmark
// flags: "llama1b" (Llama1B) and "llama8b" (Llama8B).
func Shapes() map[string]func() Config {
	return map[string]func() Config{"llama1b": Llama1B, "llama8b": Llama8B}
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
	return c, c.check()
}

func (c Config) check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, a...))
	}
	switch {
	case c.Arch != "llama" && c.Arch != "mistral" && c.Arch != "qwen2":
		return bad("arch %q: want llama, mistral or qwen2", c.Arch)
	case dtypeSize(c.DType) == 0:
		return bad("dtype %q: want float32, bfloat16 or float16", c.DType)
	case c.Layers < 0 || c.Hidden < 0 || c.Heads < 0 || c.KVHeads < 0 ||
		c.Intermediate < 0 || c.Vocab < 0 || c.ContextLength < 0:
		return bad("sizes must not be negative")
	case c.Hidden%c.Heads != 0:
		return bad("hidden %d is not a multiple of heads %d", c.Hidden, c.Heads)
	case c.Heads%c.KVHeads != 0:
		return bad("heads %d is not a multiple of kv heads %d", c.Heads, c.KVHeads)
	case (c.Hidden/c.Heads)%2 != 0:
		return bad("head size %d must be even for RoPE", c.Hidden/c.Heads)
	case c.Vocab < minVocab:
		return bad("vocab %d: want at least %d (256 bytes + %d special tokens)", c.Vocab, minVocab, len(specialTokens))
	case c.RopeTheta < 0:
		return bad("rope theta %v must be positive", c.RopeTheta)
	}
	if s := c.RopeScaling; s != nil {
		if s.Factor <= 0 || s.LowFreqFactor <= 0 || s.HighFreqFactor <= s.LowFreqFactor || s.OriginalMaxPositionEmbeddings <= 0 {
			return bad("rope scaling %+v: want factor > 0, 0 < low < high, original positions > 0", *s)
		}
	}
	return nil
}

// HeadDim is the size of one attention head.
func (c Config) HeadDim() int { return c.Hidden / c.Heads }

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
	tok := buildTokenizer(cfg.Vocab)
	files := []struct {
		name string
		v    any
	}{
		{"config.json", modelConfigJSON(cfg, tok)},
		{"generation_config.json", generationConfigJSON(tok)},
		{"tokenizer.json", tok.json()},
		{"tokenizer_config.json", tok.configJSON(cfg.ContextLength)},
	}
	for _, f := range files {
		if err := writeJSON(filepath.Join(dir, f.name), f.v); err != nil {
			return err
		}
	}
	return writeWeights(filepath.Join(dir, "model.safetensors"), cfg)
}

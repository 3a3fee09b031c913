package testmodel

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type stEntry struct {
	DType   string `json:"dtype"`
	Shape   []int  `json:"shape"`
	Offsets [2]int `json:"data_offsets"`
}

// readSafetensors parses the header and checks the data layout is
// contiguous and fills the file.
func readSafetensors(t *testing.T, path string) (map[string]stEntry, []byte) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(raw)
	if (8+n)%8 != 0 {
		t.Errorf("header length %d leaves data unaligned", n)
	}
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(raw[8:8+n], &hdr); err != nil {
		t.Fatal(err)
	}
	delete(hdr, "__metadata__")
	out := map[string]stEntry{}
	total := 0
	for name, js := range hdr {
		var e stEntry
		if err := json.Unmarshal(js, &e); err != nil {
			t.Fatal(name, err)
		}
		out[name] = e
		total += e.Offsets[1] - e.Offsets[0]
	}
	data := raw[8+n:]
	if total != len(data) {
		t.Errorf("tensors cover %d bytes, data has %d", total, len(data))
	}
	return out, data
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatal(path, err)
	}
}

func TestWriteTinyLayout(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, Tiny()); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	ts, data := readSafetensors(t, filepath.Join(dir, "model.safetensors"))
	// 1 embedding + 9 per layer + final norm + lm_head.
	if want := 1 + 2*9 + 1 + 1; len(ts) != want {
		t.Errorf("%d tensors, want %d", len(ts), want)
	}
	checks := map[string][]int{
		"model.embed_tokens.weight":              {384, 64},
		"model.layers.1.self_attn.q_proj.weight": {64, 64},
		"model.layers.1.self_attn.k_proj.weight": {32, 64},
		"model.layers.0.mlp.down_proj.weight":    {64, 128},
		"model.norm.weight":                      {64},
		"lm_head.weight":                         {384, 64},
	}
	for name, shape := range checks {
		e, ok := ts[name]
		if !ok || e.DType != "F32" || !equalInts(e.Shape, shape) {
			t.Errorf("%s: %+v, want F32 %v", name, e, shape)
		}
	}
	// The norm weights sit around 1, the embeddings around 0 with unit spread.
	norm := ts["model.norm.weight"]
	mean, _ := stats(data[norm.Offsets[0]:norm.Offsets[1]])
	if math.Abs(mean-1) > 0.1 {
		t.Errorf("norm mean %v, want about 1", mean)
	}
	emb := ts["model.embed_tokens.weight"]
	mean, std := stats(data[emb.Offsets[0]:emb.Offsets[1]])
	if math.Abs(mean) > 0.05 || math.Abs(std-1) > 0.05 {
		t.Errorf("embedding mean %v std %v, want 0 and 1", mean, std)
	}

	var cfg map[string]any
	readJSON(t, filepath.Join(dir, "config.json"), &cfg)
	if cfg["model_type"] != "llama" || cfg["hidden_size"] != 64.0 || cfg["num_key_value_heads"] != 2.0 ||
		cfg["vocab_size"] != 384.0 || cfg["tie_word_embeddings"] != false {
		t.Errorf("config.json: %v", cfg)
	}
}

func stats(b []byte) (mean, std float64) {
	n := len(b) / 4
	var s, ss float64
	for i := 0; i < n; i++ {
		v := float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
		s += v
		ss += v * v
	}
	mean = s / float64(n)
	return mean, math.Sqrt(ss/float64(n) - mean*mean)
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestReproducible(t *testing.T) {
	a, b, c := t.TempDir(), t.TempDir(), t.TempDir()
	cfg := Tiny()
	cfg.Seed = 7
	if err := Write(a, cfg); err != nil {
		t.Fatal(err)
	}
	if err := Write(b, cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Seed = 8
	if err := Write(c, cfg); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} {
		x, _ := os.ReadFile(filepath.Join(a, f))
		y, _ := os.ReadFile(filepath.Join(b, f))
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs between two writes with the same seed", f)
		}
	}
	x, _ := os.ReadFile(filepath.Join(a, "model.safetensors"))
	z, _ := os.ReadFile(filepath.Join(c, "model.safetensors"))
	if bytes.Equal(x, z) {
		t.Error("different seeds gave the same weights")
	}
}

func TestArchitectures(t *testing.T) {
	cases := []struct {
		cfg        Config
		modelType  string
		dtype      string
		has, hasnt string
	}{
		{Config{Arch: "qwen2"}, "qwen2", "F32", "model.layers.0.self_attn.q_proj.bias", ""},
		{Config{Arch: "mistral", TieEmbeddings: true, DType: "bfloat16"}, "mistral", "BF16", "model.norm.weight", "lm_head.weight"},
		{Config{DType: "float16", RopeScaling: Llama1B().RopeScaling}, "llama", "F16", "lm_head.weight", "model.layers.0.self_attn.q_proj.bias"},
	}
	for _, tc := range cases {
		dir := t.TempDir()
		if err := Write(dir, tc.cfg); err != nil {
			t.Fatal(err)
		}
		ts, _ := readSafetensors(t, filepath.Join(dir, "model.safetensors"))
		if e, ok := ts[tc.has]; !ok || e.DType != tc.dtype {
			t.Errorf("%+v: %s is %+v, want present as %s", tc.cfg, tc.has, e, tc.dtype)
		}
		if _, ok := ts[tc.hasnt]; ok {
			t.Errorf("%+v: unexpected %s", tc.cfg, tc.hasnt)
		}
		var cfg map[string]any
		readJSON(t, filepath.Join(dir, "config.json"), &cfg)
		if cfg["model_type"] != tc.modelType {
			t.Errorf("model_type %v, want %s", cfg["model_type"], tc.modelType)
		}
		if tc.cfg.RopeScaling != nil {
			rs, _ := cfg["rope_scaling"].(map[string]any)
			if rs["rope_type"] != "llama3" || rs["factor"] != 32.0 {
				t.Errorf("rope_scaling %v", cfg["rope_scaling"])
			}
		}
	}
}

func TestYarnConfig(t *testing.T) {
	for _, tc := range []struct {
		y    Yarn
		want string
	}{
		{Yarn{Factor: 4, OriginalMaxPositionEmbeddings: 32}, `{"factor":4,"original_max_position_embeddings":32,"rope_type":"yarn"}`},
		{Yarn{Factor: 4, Mscale: 1, MscaleAllDim: 0.5, BetaFast: 16, NoTruncate: true},
			`{"beta_fast":16,"factor":4,"mscale":1,"mscale_all_dim":0.5,"rope_type":"yarn","truncate":false}`},
	} {
		dir := t.TempDir()
		cfg := Tiny()
		cfg.Arch, cfg.Yarn = "qwen3", &tc.y
		if err := Write(dir, cfg); err != nil {
			t.Fatal(err)
		}
		var c map[string]any
		readJSON(t, filepath.Join(dir, "config.json"), &c)
		if got, _ := json.Marshal(c["rope_scaling"]); string(got) != tc.want {
			t.Errorf("%+v: rope_scaling %s, want %s", tc.y, got, tc.want)
		}
	}
}

func TestTokenizerFiles(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, Tiny()); err != nil {
		t.Fatal(err)
	}
	var tj struct {
		AddedTokens []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
		PreTokenizer struct{ Type string } `json:"pre_tokenizer"`
		Decoder      struct{ Type string } `json:"decoder"`
		Model        struct {
			Type   string         `json:"type"`
			Vocab  map[string]int `json:"vocab"`
			Merges []string       `json:"merges"`
		} `json:"model"`
	}
	readJSON(t, filepath.Join(dir, "tokenizer.json"), &tj)
	if tj.Model.Type != "BPE" || tj.PreTokenizer.Type != "ByteLevel" || tj.Decoder.Type != "ByteLevel" {
		t.Errorf("types: model %s pre %s decoder %s", tj.Model.Type, tj.PreTokenizer.Type, tj.Decoder.Type)
	}
	total := len(tj.Model.Vocab) + len(tj.AddedTokens)
	if total != 384 || len(tj.Model.Merges) < 100 {
		t.Errorf("vocab %d + %d special, %d merges; want 384 in all and 100+ merges", len(tj.Model.Vocab), len(tj.AddedTokens), len(tj.Model.Merges))
	}
	seen := map[int]bool{}
	for _, id := range tj.Model.Vocab {
		if seen[id] || id < 0 || id >= 384 {
			t.Errorf("bad or repeated id %d", id)
		}
		seen[id] = true
	}
	for _, m := range tj.Model.Merges {
		l, r, ok := strings.Cut(m, " ")
		if _, okl := tj.Model.Vocab[l]; !ok || !okl {
			t.Errorf("merge %q: left part not in vocab", m)
		}
		if _, okr := tj.Model.Vocab[r]; !okr {
			t.Errorf("merge %q: right part not in vocab", m)
		}
		if _, oko := tj.Model.Vocab[l+r]; !oko {
			t.Errorf("merge %q: result not in vocab", m)
		}
	}
	if _, ok := tj.Model.Vocab["Ġthe"]; !ok {
		t.Error(`the corpus's most common word "Ġthe" is not a token`)
	}
	for _, a := range tj.AddedTokens {
		if seen[a.ID] || !a.Special {
			t.Errorf("added token %+v collides or is not special", a)
		}
	}
	var tc map[string]any
	readJSON(t, filepath.Join(dir, "tokenizer_config.json"), &tc)
	tmpl, _ := tc["chat_template"].(string)
	if tc["bos_token"] != "<|begin_of_text|>" || tc["eos_token"] != "<|eot_id|>" || !strings.Contains(tmpl, "add_generation_prompt") {
		t.Errorf("tokenizer_config.json: %v", tc)
	}
}

func TestInvalidConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Arch: "gpt2"},
		{DType: "int8"},
		{Hidden: 60, Heads: 8},
		{Heads: 4, KVHeads: 3},
		{Hidden: 12, Heads: 4, KVHeads: 2},
		{Vocab: 100},
		{Layers: -1},
		{RopeScaling: &RopeScaling{Factor: 8, LowFreqFactor: 4, HighFreqFactor: 1, OriginalMaxPositionEmbeddings: 8192}},
		{Yarn: &Yarn{Factor: 0.5}},
		{Yarn: &Yarn{Factor: 4, BetaFast: 1, BetaSlow: 32}},
	} {
		err := Write(t.TempDir(), cfg)
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: err %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

func TestHalfConversions(t *testing.T) {
	for _, c := range []struct {
		v        float32
		bf, half uint16
	}{
		{1, 0x3F80, 0x3C00},
		{-2, 0xC000, 0xC000},
		{0.1, 0x3DCD, 0x2E66},
		{65504, 0x4780, 0x7BFF},
		{1e6, 0x4974, 0x7C00},
		{6e-8, 0x3381, 0x0001},
		{0, 0, 0},
	} {
		if got := bfloat16(c.v); got != c.bf {
			t.Errorf("bfloat16(%v) = %#x, want %#x", c.v, got, c.bf)
		}
		if got := float16(c.v); got != c.half {
			t.Errorf("float16(%v) = %#x, want %#x", c.v, got, c.half)
		}
	}
}

func BenchmarkWriteTiny(b *testing.B) {
	dir := b.TempDir()
	for b.Loop() {
		if err := Write(dir, Tiny()); err != nil {
			b.Fatal(err)
		}
	}
}

// TestFamilies writes every family's tiny checkpoint and checks the parts
// its engines rely on: the model_type (nested for gemma3), the weights'
// prefix and the family's own tensors.
func TestFamilies(t *testing.T) {
	own := map[string][]string{
		"llama":       {"model.layers.0.mlp.gate_proj.weight"},
		"mistral":     {"model.layers.0.mlp.gate_proj.weight"},
		"qwen2":       {"model.layers.0.self_attn.q_proj.bias"},
		"qwen3":       {"model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight"},
		"qwen3_moe":   {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.3.down_proj.weight", "model.layers.1.mlp.gate_proj.weight"},
		"mixtral":     {"model.layers.1.block_sparse_moe.gate.weight", "model.layers.1.block_sparse_moe.experts.0.w2.weight"},
		"gemma2":      {"model.layers.0.pre_feedforward_layernorm.weight", "model.layers.0.post_feedforward_layernorm.weight"},
		"gemma3_text": {"model.layers.0.self_attn.q_norm.weight", "model.layers.3.post_feedforward_layernorm.weight"},
		"gemma3":      {"language_model.model.embed_tokens.weight", "language_model.model.layers.0.self_attn.k_norm.weight"},
		"phi3":        {"model.layers.0.self_attn.qkv_proj.weight", "model.layers.1.mlp.gate_up_proj.weight"},
		"olmo2":       {"model.layers.0.post_feedforward_layernorm.weight", "model.layers.0.self_attn.q_norm.weight"},
		"gpt_oss":     {"model.layers.0.self_attn.sinks", "model.layers.3.mlp.experts.gate_up_proj", "model.layers.1.mlp.router.bias"},
	}
	if len(own) != len(TorchArchs()) {
		t.Fatalf("test covers %d families, TorchArchs lists %v", len(own), TorchArchs())
	}
	for _, arch := range TorchArchs() {
		t.Run(arch, func(t *testing.T) {
			dir := t.TempDir()
			c := TinyFamily(arch)
			if err := Write(dir, c); err != nil {
				t.Fatal(err)
			}
			var cfg map[string]any
			readJSON(t, filepath.Join(dir, "config.json"), &cfg)
			text := cfg
			if arch == "gemma3" {
				text, _ = cfg["text_config"].(map[string]any)
				if cfg["model_type"] != "gemma3" || text == nil || text["model_type"] != "gemma3_text" {
					t.Fatalf("gemma3 config: model_type %v, text_config %v", cfg["model_type"], text)
				}
			} else if cfg["model_type"] != arch {
				t.Fatalf("model_type %v", cfg["model_type"])
			}
			if hd := text["head_dim"]; hd != float64(c.HeadDim()) {
				t.Errorf("head_dim %v, want %d", hd, c.HeadDim())
			}
			hdr, _ := readSafetensors(t, filepath.Join(dir, "model.safetensors"))
			for _, name := range own[arch] {
				if _, ok := hdr[name]; !ok {
					t.Errorf("no tensor %s", name)
				}
			}
		})
	}
	for _, c := range []Config{
		{Arch: "qwen3_moe", Experts: 2, ExpertsPerToken: 3},
		{Arch: "gemma3", HeadSize: -2},
		{Arch: "phi3", PartialRotary: 1.5},
		{Arch: "gpt2"},
		{Arch: "gpt_oss", Quant: QuantFP8Block},
		{Arch: "llama", Quant: QuantMXFP4},
		{Arch: "gpt_oss", Quant: QuantMXFP4, Intermediate: 48},
	} {
		if err := Write(t.TempDir(), c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: got %v, want ErrInvalidConfig", c, err)
		}
	}
}

// TestTransformersV5 checks the transformers 5 names replace the published ones.
func TestTransformersV5(t *testing.T) {
	for _, arch := range []string{"gemma3_text", "qwen3_moe", "phi3", "llama"} {
		c := TinyFamily(arch)
		c.TransformersV5 = true
		dir := t.TempDir()
		if err := Write(dir, c); err != nil {
			t.Fatal(err)
		}
		var cfg map[string]any
		readJSON(t, filepath.Join(dir, "config.json"), &cfg)
		for _, gone := range []string{"rope_theta", "rope_scaling", "torch_dtype", "num_experts", "rope_local_base_freq", "partial_rotary_factor"} {
			if _, ok := cfg[gone]; ok {
				t.Errorf("%s: %s still written", arch, gone)
			}
		}
		rope, _ := cfg["rope_parameters"].(map[string]any)
		if arch == "gemma3_text" {
			rope, _ = rope["full_attention"].(map[string]any)
		}
		if rope["rope_theta"] != c.RopeTheta || cfg["dtype"] != "float32" {
			t.Errorf("%s: rope_parameters %v, dtype %v", arch, cfg["rope_parameters"], cfg["dtype"])
		}
	}
}

// TestShapeSizes: the benchmark shapes hold the parameters of the models
// they stand for (Llama-3.1-8B 8.03B, Llama-3.1-70B 70.55B, Qwen3-32B
// 32.76B), within 0.5%.
func TestShapeSizes(t *testing.T) {
	for name, want := range map[string]float64{"llama8b": 8.03e9, "llama70b": 70.55e9, "qwen3-32b": 32.76e9} {
		c, err := Shapes()[name]().withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		n := 0.0
		for _, ts := range tensors(c) {
			n += float64(ts.numel())
		}
		if math.Abs(n/want-1) > 0.005 {
			t.Errorf("%s: %.3g parameters, want %.4g", name, n, want)
		}
	}
}

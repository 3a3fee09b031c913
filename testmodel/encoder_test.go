package testmodel

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// TestEncoderLayout checks each encoder's config.json fields and tensor
// names and shapes, bare and as a masked-LM checkpoint.
func TestEncoderLayout(t *testing.T) {
	want := map[string]map[string][]int{
		"bert": {
			"embeddings.word_embeddings.weight":                 {384, 64},
			"embeddings.position_embeddings.weight":             {512, 64},
			"embeddings.token_type_embeddings.weight":           {2, 64},
			"embeddings.LayerNorm.bias":                         {64},
			"encoder.layer.1.attention.self.key.bias":           {64},
			"encoder.layer.0.attention.output.LayerNorm.weight": {64},
			"encoder.layer.1.intermediate.dense.weight":         {128, 64},
			"encoder.layer.1.output.dense.weight":               {64, 128},
			"encoder.layer.1.output.LayerNorm.bias":             {64},
			"pooler.dense.weight":                               {64, 64},
		},
		"modernbert": {
			"embeddings.tok_embeddings.weight": {384, 64},
			"embeddings.norm.weight":           {64},
			"layers.0.attn.Wqkv.weight":        {192, 64},
			"layers.1.attn_norm.weight":        {64},
			"layers.2.attn.Wo.weight":          {64, 64},
			"layers.2.mlp_norm.weight":         {64},
			"layers.2.mlp.Wi.weight":           {256, 64},
			"layers.2.mlp.Wo.weight":           {64, 128},
			"final_norm.weight":                {64},
		},
	}
	absent := map[string][]string{
		"bert":       {"bert.embeddings.word_embeddings.weight", "cls.predictions.bias"},
		"modernbert": {"layers.0.attn_norm.weight", "final_norm.bias", "layers.1.attn.Wqkv.bias", "head.dense.weight"},
	}
	if got := EncoderArchs(); len(got) != len(want) {
		t.Fatalf("EncoderArchs %v", got)
	}
	for _, arch := range EncoderArchs() {
		for _, masked := range []bool{false, true} {
			c := TinyFamily(arch)
			c.MaskedLM = masked
			dir := t.TempDir()
			if err := Write(dir, c); err != nil {
				t.Fatal(err)
			}
			hdr, _ := readSafetensors(t, filepath.Join(dir, "model.safetensors"))
			prefix := ""
			if masked {
				prefix = encoders[arch].prefix
			}
			for name, shape := range want[arch] {
				if e, ok := hdr[prefix+name]; !ok || !equalInts(e.Shape, shape) {
					t.Errorf("%s masked=%v: %s: %+v (present %v), want shape %v", arch, masked, prefix+name, e, ok, shape)
				}
			}
			if !masked {
				for _, name := range absent[arch] {
					if _, ok := hdr[name]; ok {
						t.Errorf("%s: %s written", arch, name)
					}
				}
			}
			var cfg map[string]any
			readJSON(t, filepath.Join(dir, "config.json"), &cfg)
			class := encoders[arch].class
			if masked {
				class = encoders[arch].maskedLM
			}
			if cfg["model_type"] != arch || cfg["architectures"].([]any)[0] != class {
				t.Errorf("%s: model_type %v, architectures %v", arch, cfg["model_type"], cfg["architectures"])
			}
			switch arch {
			case "bert":
				if cfg["layer_norm_eps"] != 1e-12 || cfg["hidden_act"] != "gelu" || cfg["type_vocab_size"] != 2.0 {
					t.Errorf("bert config %v", cfg)
				}
			case "modernbert":
				if cfg["local_attention"] != 16.0 || cfg["global_attn_every_n_layers"] != 2.0 ||
					cfg["global_rope_theta"] != 160000.0 || cfg["norm_bias"] != false || cfg["cls_token_id"] == nil {
					t.Errorf("modernbert config %v", cfg)
				}
			}
		}
	}
}

// TestWordPieceTokenizer checks the BERT tokenizer's files: BERT's ids for
// the special tokens, every lowercase character and its continuation in
// the vocabulary, the corpus's words as whole tokens, [CLS] A [SEP].
func TestWordPieceTokenizer(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, TinyFamily("bert")); err != nil {
		t.Fatal(err)
	}
	var tj struct {
		Normalizer    map[string]any `json:"normalizer"`
		PreTokenizer  map[string]any `json:"pre_tokenizer"`
		PostProcessor map[string]any `json:"post_processor"`
		Decoder       map[string]any `json:"decoder"`
		Model         struct {
			Type   string         `json:"type"`
			Prefix string         `json:"continuing_subword_prefix"`
			Vocab  map[string]int `json:"vocab"`
		} `json:"model"`
	}
	readJSON(t, filepath.Join(dir, "tokenizer.json"), &tj)
	if tj.Model.Type != "WordPiece" || tj.Model.Prefix != "##" || tj.Normalizer["type"] != "BertNormalizer" ||
		tj.Normalizer["lowercase"] != true || tj.PreTokenizer["type"] != "BertPreTokenizer" ||
		tj.PostProcessor["type"] != "TemplateProcessing" || tj.Decoder["type"] != "WordPiece" {
		t.Errorf("tokenizer.json: %+v", tj)
	}
	for tok, id := range map[string]int{"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103} {
		if tj.Model.Vocab[tok] != id {
			t.Errorf("%s is %d, want %d", tok, tj.Model.Vocab[tok], id)
		}
	}
	for _, s := range []string{"a", "z", "0", "!", "##q", "##7", "the", "fox"} {
		if _, ok := tj.Model.Vocab[s]; !ok {
			t.Errorf("%q not in the vocabulary", s)
		}
	}
	for tok, id := range tj.Model.Vocab {
		if id < 0 || id >= 384 || id >= len(tj.Model.Vocab) {
			t.Errorf("%q has id %d of %d", tok, id, len(tj.Model.Vocab))
		}
	}
	if len(tj.Model.Vocab) < 300 {
		t.Errorf("vocab %d: the corpus's words are missing", len(tj.Model.Vocab))
	}
	var tc map[string]any
	readJSON(t, filepath.Join(dir, "tokenizer_config.json"), &tc)
	if tc["tokenizer_class"] != "BertTokenizer" || tc["do_lower_case"] != true || tc["cls_token"] != "[CLS]" {
		t.Errorf("tokenizer_config.json: %v", tc)
	}
	if err := Write(t.TempDir(), Config{Arch: "bert", KVHeads: 4, Vocab: 200}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bert vocab 200: %v", err)
	}
	if err := Write(t.TempDir(), Config{Arch: "bert", Heads: 4, KVHeads: 2}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bert with grouped KV heads: %v", err)
	}
}

// TestModernBertTokenizer checks ModernBERT's BPE tokenizer wraps inputs
// in [CLS] and [SEP] and config.json names their ids.
func TestModernBertTokenizer(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, TinyFamily("modernbert")); err != nil {
		t.Fatal(err)
	}
	var tj struct {
		AddedTokens []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
		} `json:"added_tokens"`
		PostProcessor struct {
			Type          string `json:"type"`
			SpecialTokens map[string]struct {
				IDs []int `json:"ids"`
			} `json:"special_tokens"`
		} `json:"post_processor"`
	}
	readJSON(t, filepath.Join(dir, "tokenizer.json"), &tj)
	ids := map[string]int{}
	for _, a := range tj.AddedTokens {
		ids[a.Content] = a.ID
	}
	var cfg map[string]any
	readJSON(t, filepath.Join(dir, "config.json"), &cfg)
	if tj.PostProcessor.Type != "TemplateProcessing" || tj.PostProcessor.SpecialTokens["[CLS]"].IDs[0] != ids["[CLS]"] ||
		cfg["cls_token_id"] != float64(ids["[CLS]"]) || cfg["sep_token_id"] != float64(ids["[SEP]"]) ||
		cfg["pad_token_id"] != float64(ids["[PAD]"]) || ids["[CLS]"] == 0 {
		t.Errorf("added %v, post-processor %+v, config ids %v %v", ids, tj.PostProcessor, cfg["cls_token_id"], cfg["sep_token_id"])
	}
}

// TestEmbeddingFiles writes each pooling and reads it back with
// engine.ReadPooling, the loaders' reader.
func TestEmbeddingFiles(t *testing.T) {
	for _, tc := range []struct {
		arch, pool string
		norm       bool
		want       engine.Pooling
	}{
		{"bert", "cls", true, engine.PoolCLS},
		{"modernbert", "mean", false, engine.PoolMean},
		{"qwen3", "lasttoken", true, engine.PoolLast},
	} {
		c := TinyFamily(tc.arch)
		c.Embedding = &Embedding{Pooling: tc.pool, Normalize: tc.norm, MaxSeqLength: 256, MatryoshkaDims: []int{32, 64}}
		dir := t.TempDir()
		if err := Write(dir, c); err != nil {
			t.Fatal(err)
		}
		got, err := engine.ReadPooling(dir, IsEncoder(tc.arch))
		if err != nil {
			t.Fatal(tc.arch, err)
		}
		if got.Pooling != tc.want || got.Normalize != tc.norm || got.MaxLength != 256 || !got.Published ||
			!got.Matryoshka || !equalInts(got.MatryoshkaDims, []int{32, 64}) {
			t.Errorf("%s: %+v", tc.arch, got)
		}
	}
	c := TinyFamily("bert")
	c.Embedding = &Embedding{Pooling: "max"}
	dir := t.TempDir()
	if err := Write(dir, c); err != nil {
		t.Fatal(err)
	}
	var ce *engine.CheckpointError
	if _, err := engine.ReadPooling(dir, true); !errors.As(err, &ce) {
		t.Errorf("max pooling: %v", err)
	}
}

// TestEmbeddingShapes checks the two embedding shapes' layouts without
// writing their weights.
func TestEmbeddingShapes(t *testing.T) {
	bge, err := Shapes()["bge-base"]().withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string][]int{}
	for _, ts := range tensors(bge) {
		names[ts.name] = ts.shape
	}
	if !equalInts(names["embeddings.word_embeddings.weight"], []int{30522, 768}) ||
		!equalInts(names["encoder.layer.11.intermediate.dense.weight"], []int{3072, 768}) {
		t.Errorf("bge-base tensors: %d", len(names))
	}
	q, err := Shapes()["qwen3-embedding-0.6b"]().withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range tensors(q) {
		if strings.HasPrefix(ts.name, "model.") || ts.name == "lm_head.weight" {
			t.Errorf("qwen3-embedding: %s", ts.name)
		}
		if ts.name == "layers.27.self_attn.k_proj.weight" && !equalInts(ts.shape, []int{1024, 1024}) {
			t.Errorf("k_proj %v", ts.shape)
		}
	}
}

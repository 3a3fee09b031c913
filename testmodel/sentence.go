package testmodel

import (
	"os"
	"path/filepath"
)

// Embedding describes the sentence-transformers files of an embedding
// checkpoint: how its vectors are pooled and whether they are normalized.
type Embedding struct {
	// Pooling is the Pooling module's mode: "cls", "mean" or "lasttoken"
	// (any other value is written as pooling_mode, for tests of what a
	// loader refuses).
	Pooling string
	// Normalize adds the Normalize module after pooling.
	Normalize bool
	// MaxSeqLength is sentence_bert_config.json's max_seq_length; zero
	// writes no sentence_bert_config.json.
	MaxSeqLength int
	// MatryoshkaDims, when set, writes config.json's
	// matryoshka_dimensions.
	MatryoshkaDims []int
}

// writeSentenceTransformers writes modules.json (Transformer, Pooling and
// Normalize modules), 1_Pooling/config.json,
// config_sentence_transformers.json and sentence_bert_config.json, as
// sentence-transformers' save does.
func writeSentenceTransformers(dir string, c Config) error {
	e := c.Embedding
	mods := []map[string]any{
		{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
		{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
	}
	if e.Normalize {
		mods = append(mods, map[string]any{"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
	}
	pool := map[string]any{
		"word_embedding_dimension":          c.Hidden,
		"pooling_mode_cls_token":            e.Pooling == "cls",
		"pooling_mode_mean_tokens":          e.Pooling == "mean",
		"pooling_mode_max_tokens":           false,
		"pooling_mode_mean_sqrt_len_tokens": false,
		"pooling_mode_weightedmean_tokens":  false,
		"pooling_mode_lasttoken":            e.Pooling == "lasttoken",
		"include_prompt":                    true,
	}
	switch e.Pooling {
	case "cls", "mean", "lasttoken":
	default:
		pool["pooling_mode"] = e.Pooling
	}
	if err := os.MkdirAll(filepath.Join(dir, "1_Pooling"), 0o755); err != nil {
		return err
	}
	files := []struct {
		name string
		v    any
	}{
		{"modules.json", mods},
		{"1_Pooling/config.json", pool},
		{"config_sentence_transformers.json", map[string]any{
			"__version__":         map[string]any{"sentence_transformers": "3.0.1", "transformers": "4.44.2", "pytorch": "2.4.0"},
			"prompts":             map[string]any{},
			"default_prompt_name": nil,
			"similarity_fn_name":  "cosine",
		}},
	}
	if e.MaxSeqLength > 0 {
		files = append(files, struct {
			name string
			v    any
		}{"sentence_bert_config.json", map[string]any{"max_seq_length": e.MaxSeqLength, "do_lower_case": false}})
	}
	for _, f := range files {
		if err := writeJSON(filepath.Join(dir, filepath.FromSlash(f.name)), f.v); err != nil {
			return err
		}
	}
	return nil
}

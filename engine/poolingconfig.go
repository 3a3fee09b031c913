package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// stModule is one entry of sentence-transformers' modules.json.
type stModule struct {
	Idx  int    `json:"idx"`
	Name string `json:"name"`
	Path string `json:"path"`
	Type string `json:"type"`
}

// stPooling is a Pooling module's config.json (sentence-transformers 2
// and later write every flag; older files miss some, read as false).
type stPooling struct {
	CLS           bool   `json:"pooling_mode_cls_token"`
	Mean          bool   `json:"pooling_mode_mean_tokens"`
	Max           bool   `json:"pooling_mode_max_tokens"`
	MeanSqrtLen   bool   `json:"pooling_mode_mean_sqrt_len_tokens"`
	WeightedMean  bool   `json:"pooling_mode_weightedmean_tokens"`
	LastToken     bool   `json:"pooling_mode_lasttoken"`
	IncludePrompt *bool  `json:"include_prompt"`
	Mode          string `json:"pooling_mode"` // newer files may name the mode
}

func readPooling(dir string, encoder bool) (PoolingConfig, error) {
	def := PoolingConfig{Pooling: PoolLast, Normalize: true}
	if encoder {
		def.Pooling = PoolMean
	}
	var err error
	if def.Matryoshka, def.MatryoshkaDims, err = readMatryoshka(dir); err != nil {
		return def, err
	}
	modPath := filepath.Join(dir, "modules.json")
	raw, err := os.ReadFile(modPath)
	if errors.Is(err, fs.ErrNotExist) {
		return def, nil
	}
	if err != nil {
		return def, &CheckpointError{Path: modPath, Reason: err.Error()}
	}
	var mods []stModule
	if err := json.Unmarshal(raw, &mods); err != nil {
		return def, &CheckpointError{Path: modPath, Reason: "not a sentence-transformers module list: " + err.Error()}
	}
	cfg := PoolingConfig{Published: true, Matryoshka: def.Matryoshka, MatryoshkaDims: def.MatryoshkaDims}
	pooled := false
	for _, m := range mods {
		kind := m.Type[strings.LastIndex(m.Type, ".")+1:]
		switch {
		case kind == "Transformer" && !pooled:
			// The model itself.
		case kind == "Pooling" && !pooled:
			p, err := readPoolingModule(dir, m)
			if err != nil {
				return def, err
			}
			cfg.Pooling, pooled = p, true
		case kind == "Normalize" && pooled:
			cfg.Normalize = true
		default:
			return def, &CheckpointError{Path: modPath,
				Reason: fmt.Sprintf("module %q (%s) is not supported: only Transformer, Pooling and Normalize modules are served", m.Name, m.Type)}
		}
	}
	if !pooled {
		return def, &CheckpointError{Path: modPath, Reason: "no Pooling module"}
	}
	n, err := readMaxLength(dir)
	if err != nil {
		return def, err
	}
	cfg.MaxLength = n
	return cfg, nil
}

// readMatryoshka reads config.json's is_matryoshka and
// matryoshka_dimensions.
func readMatryoshka(dir string) (ok bool, dims []int, err error) {
	path := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return false, nil, &CheckpointError{Path: path, Reason: err.Error()}
	}
	var c struct {
		IsMatryoshka bool  `json:"is_matryoshka"`
		Dims         []int `json:"matryoshka_dimensions"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return false, nil, &CheckpointError{Path: path, Reason: err.Error()}
	}
	for _, d := range c.Dims {
		if d <= 0 {
			return false, nil, &CheckpointError{Path: path, Reason: fmt.Sprintf("matryoshka_dimensions holds %d", d)}
		}
	}
	return c.IsMatryoshka || len(c.Dims) > 0, c.Dims, nil
}

func readPoolingModule(dir string, m stModule) (Pooling, error) {
	path := filepath.Join(dir, filepath.FromSlash(m.Path), "config.json")
	if !filepath.IsLocal(filepath.FromSlash(m.Path)) {
		return PoolNone, &CheckpointError{Path: filepath.Join(dir, "modules.json"), Reason: fmt.Sprintf("module path %q leaves the checkpoint", m.Path)}
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return PoolNone, &CheckpointError{Path: path, Reason: err.Error()}
	}
	var p stPooling
	if err := json.Unmarshal(raw, &p); err != nil {
		return PoolNone, &CheckpointError{Path: path, Reason: err.Error()}
	}
	switch p.Mode {
	case "":
	case "cls":
		p.CLS = true
	case "mean":
		p.Mean = true
	case "lasttoken":
		p.LastToken = true
	default:
		return PoolNone, &CheckpointError{Path: path, Reason: fmt.Sprintf("pooling_mode %q is not supported (mean, cls and lasttoken are)", p.Mode)}
	}
	if p.Max || p.MeanSqrtLen || p.WeightedMean {
		return PoolNone, &CheckpointError{Path: path, Reason: "max, mean-sqrt-len and weighted-mean pooling are not supported (mean, cls and lasttoken are)"}
	}
	if p.IncludePrompt != nil && !*p.IncludePrompt {
		return PoolNone, &CheckpointError{Path: path, Reason: "include_prompt false (pooling that skips an instruction prefix) is not supported"}
	}
	var modes []Pooling
	if p.CLS {
		modes = append(modes, PoolCLS)
	}
	if p.Mean {
		modes = append(modes, PoolMean)
	}
	if p.LastToken {
		modes = append(modes, PoolLast)
	}
	if len(modes) != 1 {
		return PoolNone, &CheckpointError{Path: path, Reason: fmt.Sprintf("%d pooling modes set; exactly one of cls, mean and lasttoken is supported", len(modes))}
	}
	return modes[0], nil
}

// readMaxLength reads sentence_bert_config.json's max_seq_length; a
// missing file is no limit.
func readMaxLength(dir string) (int, error) {
	path := filepath.Join(dir, "sentence_bert_config.json")
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, &CheckpointError{Path: path, Reason: err.Error()}
	}
	var c struct {
		MaxSeqLength int `json:"max_seq_length"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return 0, &CheckpointError{Path: path, Reason: err.Error()}
	}
	if c.MaxSeqLength < 0 {
		return 0, &CheckpointError{Path: path, Reason: fmt.Sprintf("max_seq_length %d is negative", c.MaxSeqLength)}
	}
	return c.MaxSeqLength, nil
}

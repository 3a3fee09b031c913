package tokenizer

import (
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/testmodel"
)

// TestLoadTestModel loads the byte-level tokenizer testmodel
// writes into test checkpoints and checks round trips and its template.
func TestLoadTestModel(t *testing.T) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	bos, ok := tok.BOS()
	if !ok || len(tok.EOS()) == 0 {
		t.Fatalf("BOS = %d, %v; EOS = %v", bos, ok, tok.EOS())
	}
	for _, text := range []string{"The quick brown fox jumps over the lazy dog.", "héllo 世界 🍕\n\t ", ""} {
		ids, err := tok.Encode(text, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if id < 0 || int(id) >= tok.VocabSize() {
				t.Fatalf("id %d outside vocabulary of %d", id, tok.VocabSize())
			}
		}
		if got, _ := tok.Decode(ids, false); got != text {
			t.Errorf("round trip %q -> %v -> %q", text, ids, got)
		}
	}
	if ids, _ := tok.Encode("the the the", false); len(ids) >= len("the the the") {
		t.Errorf("merges unused: %v", ids)
	}
	prompt, err := tok.ApplyChatTemplate([]Message{{Role: "user", Content: "Hi"}}, ChatOptions{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(prompt, "<|start_header_id|>assistant<|end_header_id|>\n\n") || !strings.Contains(prompt, "Hi<|eot_id|>") {
		t.Errorf("template rendered %q", prompt)
	}
	ids, _ := tok.Encode(prompt, false)
	if ids[0] != bos {
		t.Errorf("rendered prompt does not start with BOS: %v", ids)
	}
}

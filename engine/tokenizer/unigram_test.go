package tokenizer

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"unicode/utf8"
)

// unigramTokenizer loads testdata/unigram (see testdata/gen/unigram.mjs).
func unigramTokenizer(t testing.TB) *Tokenizer {
	t.Helper()
	tok, err := Load(filepath.Join("testdata", "unigram"))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// xlmrTokenizer loads testdata/xlmr (see testdata/gen/xlmr.mjs): a
// Unigram tokenizer with SentencePiece's nmt_nfkc Precompiled charsmap.
func xlmrTokenizer(t testing.TB) *Tokenizer {
	t.Helper()
	tok, err := Load(filepath.Join("testdata", "xlmr"))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestUnigramGolden compares Encode and Decode of the XLM-RoBERTa-shaped
// Unigram tokenizer of testdata/unigram with the reference
// implementation's output (testdata/gen/unigram.mjs).
func TestUnigramGolden(t *testing.T) {
	tok := unigramTokenizer(t)
	texts := wordPieceTexts(t)
	var golden struct {
		Cases map[string]goldenCase `json:"cases"`
	}
	readJSON(t, filepath.Join("testdata", "golden", "encode_unigram.json"), &golden)
	if len(golden.Cases) != len(texts) {
		t.Fatalf("golden has %d cases, texts %d: regenerate with testdata/gen/unigram.mjs", len(golden.Cases), len(texts))
	}
	for key, want := range golden.Cases {
		text := texts[key]
		if got, err := tok.Encode(text, false); err != nil || !slices.Equal(got, want.IDs) {
			t.Errorf("%s: Encode(%q)\n got %v, %v\nwant %v", key, text, got, err, want.IDs)
		}
		if got, _ := tok.Encode(text, true); !slices.Equal(got, want.IDsSpecial) {
			t.Errorf("%s: Encode(addSpecial)\n got %v\nwant %v", key, got, want.IDsSpecial)
		}
		if dec, err := tok.Decode(want.IDs, false); (err != nil || dec != want.Decoded) && !jsMetaspaceDiffers(tok, want.IDs, false) {
			t.Errorf("%s: Decode = %q, %v; want %q", key, dec, err, want.Decoded)
		}
		if dec, err := tok.Decode(want.IDsSpecial, true); (err != nil || dec != want.DecodedSkip) && !jsMetaspaceDiffers(tok, want.IDsSpecial, true) {
			t.Errorf("%s: Decode(skipSpecial) = %q, %v; want %q", key, dec, err, want.DecodedSkip)
		}
	}
}

// unigramFile builds a small Unigram tokenizer.json (no normalizer or
// pre-tokenizer) from pieces and scores.
func unigramFile(t *testing.T, unk int, byteFallback bool, pieces ...any) []byte {
	t.Helper()
	var vocab [][2]any
	for i := 0; i < len(pieces); i += 2 {
		vocab = append(vocab, [2]any{pieces[i], pieces[i+1]})
	}
	if byteFallback {
		for b := 0; b < 256; b++ {
			vocab = append(vocab, [2]any{byteTokenName(byte(b)), -50.0})
		}
	}
	data, err := json.Marshal(map[string]any{"model": map[string]any{"type": "Unigram", "unk_id": unk, "vocab": vocab, "byte_fallback": byteFallback}})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestUnigramRules checks Hugging Face's Viterbi rules directly: the best
// total score wins, ties go to the path found first (the earliest start),
// runs of unknown characters become one unknown token, and with
// byte_fallback the bytes of that run instead (which the JavaScript
// reference does not implement).
func TestUnigramRules(t *testing.T) {
	// ids: 0 <unk>, 1 a, 2 b, 3 ab, 4 c, 5 bc
	pieces := []any{"<unk>", 0.0, "a", -1.0, "b", -1.0, "ab", -2.5, "c", -1.0, "bc", -1.0}
	cases := []struct {
		text         string
		byteFallback bool
		want         []int32
	}{
		{"ab", false, []int32{1, 2}},      // -2 beats -2.5
		{"abc", false, []int32{1, 5}},     // a+bc = -2 beats ab+c = -3.5
		{"a中文b", false, []int32{1, 0, 2}}, // one fused unknown token
		{"a中文b", true, append(append([]int32{1}, bytesIDs(6, "中文")...), 2)},
		{"", false, nil},
	}
	for _, c := range cases {
		tok, err := FromJSON(unigramFile(t, 0, c.byteFallback, pieces...), nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tok.Encode(c.text, false)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q, byte_fallback %v) = %v, %v; want %v", c.text, c.byteFallback, got, err, c.want)
		}
	}
	// A tie: "ab" (-2) against a+b (-1 + -1). The candidates for the end
	// of the word are tried by start position; "ab" (start 0) comes before
	// "b" (start 1) and only a strictly better score replaces it.
	tie, err := FromJSON(unigramFile(t, 0, false, "<unk>", 0.0, "a", -1.0, "b", -1.0, "ab", -2.0), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := tie.Encode("ab", false); !slices.Equal(got, []int32{3}) {
		t.Errorf("tie: Encode(ab) = %v, want [3]", got)
	}
}

// bytesIDs is the byte-token ids of s in a unigramFile vocabulary whose
// byte tokens start at first.
func bytesIDs(first int32, s string) []int32 {
	var ids []int32
	for i := 0; i < len(s); i++ {
		ids = append(ids, first+int32(s[i]))
	}
	return ids
}

func TestUnigramBadFiles(t *testing.T) {
	for name, spec := range map[string]string{
		"no unk_id":    `{"model": {"type": "Unigram", "vocab": [["a", -1.0]]}}`,
		"unk outside":  `{"model": {"type": "Unigram", "unk_id": 3, "vocab": [["a", -1.0]]}}`,
		"empty vocab":  `{"model": {"type": "Unigram", "unk_id": 0, "vocab": []}}`,
		"bad entry":    `{"model": {"type": "Unigram", "unk_id": 0, "vocab": [["a", "high"]]}}`,
		"vocab object": `{"model": {"type": "Unigram", "unk_id": 0, "vocab": {"a": 1}}}`,
	} {
		_, err := FromJSON([]byte(spec), nil)
		var fe *FileError
		if !errors.As(err, &fe) || fe.Field == "" {
			t.Errorf("%s: got %v, want a *FileError naming the field", name, err)
		}
	}
}

// FuzzPrecompiled: any charsmap bytes either load or give a *FileError,
// and a loaded one normalizes any text without panicking.
func FuzzPrecompiled(f *testing.F) {
	f.Add([]byte{8, 0, 0, 0, 1, 2, 0, 0, 0x61, 1, 0, 0, 'x', 0}, "a\u0301b")
	f.Add([]byte{4, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, "abc")
	f.Fuzz(func(t *testing.T, charsmap []byte, text string) {
		p, err := newPrecompiled(base64.StdEncoding.EncodeToString(charsmap), "normalizer")
		if err != nil {
			var fe *FileError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v is not a *FileError", err)
			}
			return
		}
		if utf8.ValidString(text) {
			_ = p.normalize(text)
		}
	})
}

package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"
)

// wordPieceVariants are the BERT-style tokenizers of testdata/wordpiece
// that testdata/gen/wordpiece.mjs made goldens for.
var wordPieceVariants = []string{"bert_uncased", "bert_cased", "bert_strip"}

// wordPieceTokenizer loads testdata/wordpiece/tokenizer.json rewritten as
// the named variant, exactly as testdata/gen/wordpiece.mjs rewrites it.
func wordPieceTokenizer(t testing.TB, name string) *Tokenizer {
	t.Helper()
	var m map[string]any
	readJSON(t, filepath.Join("testdata", "wordpiece", "tokenizer.json"), &m)
	normalizer := m["normalizer"].(map[string]any)
	model := m["model"].(map[string]any)
	vocab := model["vocab"].(map[string]any)
	switch name {
	case "bert_uncased":
	case "bert_cased":
		normalizer["lowercase"] = false
		m["post_processor"] = map[string]any{"type": "BertProcessing", "sep": []any{"[SEP]", vocab["[SEP]"]}, "cls": []any{"[CLS]", vocab["[CLS]"]}}
	case "bert_strip":
		normalizer["lowercase"] = false
		normalizer["strip_accents"] = true
		normalizer["handle_chinese_chars"] = false
		model["max_input_chars_per_word"] = 12
		m["decoder"].(map[string]any)["cleanup"] = false
	default:
		t.Fatalf("unknown variant %s", name)
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := FromJSON(data, nil)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return tok
}

// wordPieceTexts is every text the WordPiece goldens cover: corpus.json
// and testdata/wordpiece/texts.json.
func wordPieceTexts(t testing.TB) map[string]string {
	texts := loadCorpus(t)
	var extra map[string]string
	readJSON(t, filepath.Join("testdata", "wordpiece", "texts.json"), &extra)
	for k, v := range extra {
		texts[k] = v
	}
	return texts
}

type wordPieceGolden struct {
	Cases map[string]struct {
		goldenCase
		IDsPair     []int32 `json:"ids_pair"`
		TypeIDsPair []int32 `json:"type_ids_pair"`
	} `json:"cases"`
	Decodes []struct {
		IDs         []int32 `json:"ids"`
		Decoded     string  `json:"decoded"`
		DecodedSkip string  `json:"decoded_skip"`
	} `json:"decodes"`
}

// TestWordPieceGolden compares Encode, EncodePair and Decode of the
// BERT-style tokenizers with the reference implementation's output on
// the corpus, BERT-specific texts and seeded random texts.
func TestWordPieceGolden(t *testing.T) {
	texts := wordPieceTexts(t)
	keys := make([]string, 0, len(texts))
	for k := range texts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, name := range wordPieceVariants {
		t.Run(name, func(t *testing.T) {
			tok := wordPieceTokenizer(t, name)
			var golden wordPieceGolden
			readJSON(t, filepath.Join("testdata", "golden", "encode_"+name+".json"), &golden)
			if len(golden.Cases) != len(texts) {
				t.Fatalf("golden has %d cases, texts %d: regenerate with testdata/gen/wordpiece.mjs", len(golden.Cases), len(texts))
			}
			for i, key := range keys {
				want, ok := golden.Cases[key]
				if !ok {
					t.Fatalf("golden lacks %s: regenerate with testdata/gen/wordpiece.mjs", key)
				}
				text := texts[key]
				if got, err := tok.Encode(text, false); err != nil || !slices.Equal(got, want.IDs) {
					t.Errorf("%s: Encode(%q)\n got %v, %v\nwant %v", key, text, got, err, want.IDs)
				}
				if got, _ := tok.Encode(text, true); !slices.Equal(got, want.IDsSpecial) {
					t.Errorf("%s: Encode(addSpecial)\n got %v\nwant %v", key, got, want.IDsSpecial)
				}
				// The reference treats an empty second text as none at all
				// (Hugging Face encodes it as an empty sequence: TestEncodePair).
				pairText := texts[keys[(i+1)%len(keys)]]
				ids, types, err := tok.EncodePair(text, pairText, true)
				if want.IDsPair != nil && pairText != "" && (err != nil || !slices.Equal(ids, want.IDsPair) || !slices.Equal(types, want.TypeIDsPair)) {
					t.Errorf("%s: EncodePair(%q, %q)\n got %v %v, %v\nwant %v %v", key, text, pairText, ids, types, err, want.IDsPair, want.TypeIDsPair)
				}
				if dec, err := tok.Decode(want.IDs, false); err != nil || dec != want.Decoded {
					t.Errorf("%s: Decode = %q, %v; want %q", key, dec, err, want.Decoded)
				}
				if dec, err := tok.Decode(want.IDsSpecial, true); err != nil || dec != want.DecodedSkip {
					t.Errorf("%s: Decode(skipSpecial) = %q, %v; want %q", key, dec, err, want.DecodedSkip)
				}
			}
			for _, d := range golden.Decodes {
				if got, err := tok.Decode(d.IDs, false); err != nil || got != d.Decoded {
					t.Errorf("Decode(%v) = %q, %v; want %q", d.IDs, got, err, d.Decoded)
				}
				if got, err := tok.Decode(d.IDs, true); err != nil || got != d.DecodedSkip {
					t.Errorf("Decode(%v, skipSpecial) = %q, %v; want %q", d.IDs, got, err, d.DecodedSkip)
				}
			}
		})
	}
}

// TestWordPieceStream: streamed deltas add up to Decode for the
// WordPiece decoder, whose first token is written differently.
func TestWordPieceStream(t *testing.T) {
	tok := wordPieceTokenizer(t, "bert_uncased")
	for _, text := range []string{"Hello, world! It's tokenization.", "##ing starts", "中文 and more", ""} {
		ids, err := tok.Encode(text, true)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := tok.Decode(ids, true)
		_, _, got := streamAll(t, tok, nil, ids, nil)
		if got != want {
			t.Errorf("%q: streamed %q, Decode %q", text, got, want)
		}
		for cut := 0; cut <= len(ids); cut++ {
			whole, _ := tok.Decode(ids, true)
			head, _ := tok.Decode(ids[:cut], true)
			_, _, tail := streamAll(t, tok, ids[:cut], ids[cut:], nil)
			if head+tail != whole {
				t.Errorf("%q cut at %d: %q + %q != %q", text, cut, head, tail, whole)
			}
		}
	}
	cont, _ := tok.TokenID("##ing")
	if got, _ := tok.Decode([]int32{cont}, false); got != "##ing" {
		t.Errorf(`Decode([##ing]) = %q, want "##ing" (a first token keeps its prefix)`, got)
	}
}

// tokenIDs looks tokens up, failing the test for a missing one.
func tokenIDs(t *testing.T, tok *Tokenizer, tokens ...string) []int32 {
	t.Helper()
	ids := make([]int32, len(tokens))
	for i, s := range tokens {
		id, ok := tok.TokenID(s)
		if !ok {
			t.Fatalf("token %q is not in the vocabulary", s)
		}
		ids[i] = id
	}
	return ids
}

// TestWordPieceRustRules covers the inputs on which the JavaScript
// reference departs from Hugging Face's Rust implementation, which this
// package follows (tokenizers/src/normalizers/bert.rs): CJK ideographs
// outside the BMP are spaced out too, and lowercasing is per character
// (a final capital sigma becomes σ, not ς).
func TestWordPieceRustRules(t *testing.T) {
	tok := wordPieceTokenizer(t, "bert_uncased")
	cases := []struct {
		text   string
		tokens []string
	}{
		{"a\U00020000b", []string{"a", "[UNK]", "b"}},        // CJK Extension B: its own word
		{"\U0002F800\U0002A700", []string{"[UNK]", "[UNK]"}}, // compatibility supplement, Extension C
		{"ΣΟΣ", []string{"σ", "##ο", "##σ"}},                 // no final-sigma rule
		{"İ", []string{"i"}},                                 // i + U+0307, whose accent is stripped
	}
	for _, c := range cases {
		got, err := tok.Encode(c.text, false)
		if want := tokenIDs(t, tok, c.tokens...); err != nil || !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, %v; want %v %v", c.text, got, err, c.tokens, want)
		}
	}
	// Whitespace is Unicode's White_Space (Rust's char::is_whitespace):
	// U+0085 splits, U+FEFF does not (JavaScript's \s says the opposite);
	// it matters only without clean_text, which removes both as controls.
	if got := (bertPre{}).split(nil, "a\u0085b\ufeffc", true); !slices.Equal(got, []string{"a", "b\ufeffc"}) {
		t.Errorf("BertPreTokenizer split = %q", got)
	}
	cased := wordPieceTokenizer(t, "bert_cased")
	if got, want := bertLowercase("ΣΟΣ İ"), "σοσ i\u0307"; got != want {
		t.Errorf("bertLowercase = %q, want %q", got, want)
	}
	lower, err := parseNormalizers(json.RawMessage(`{"type": "Lowercase"}`), "normalizer")
	if err != nil || len(lower) != 1 || lower[0]("İA") != "i\u0307a" {
		t.Errorf("Lowercase normalizer: %v", err)
	}
	if got, _ := cased.Encode("ÉCOLE", false); slices.Contains(got, tokenIDs(t, cased, "E")[0]) {
		t.Errorf("cased tokenizer stripped the accent of É: %v", got)
	}
}

// TestEncodePair: the pair forms of BertProcessing, RobertaProcessing and
// TemplateProcessing, an empty second text, no special tokens, and a
// tokenizer without a pair form.
func TestEncodePair(t *testing.T) {
	tok := wordPieceTokenizer(t, "bert_cased")
	cls, sep := tokenIDs(t, tok, "[CLS]")[0], tokenIDs(t, tok, "[SEP]")[0]
	a, _ := tok.Encode("the", false)
	b, _ := tok.Encode("world", false)
	ids, types, err := tok.EncodePair("the", "world", true)
	wantIDs := slices.Concat([]int32{cls}, a, []int32{sep}, b, []int32{sep})
	wantTypes := slices.Concat(make([]int32, len(a)+2), []int32{1}, slices.Repeat([]int32{1}, len(b)))
	if err != nil || !slices.Equal(ids, wantIDs) || !slices.Equal(types, wantTypes) {
		t.Errorf("BertProcessing pair = %v %v, %v; want %v %v", ids, types, err, wantIDs, wantTypes)
	}
	ids, types, _ = tok.EncodePair("the", "", true)
	if want := slices.Concat([]int32{cls}, a, []int32{sep, sep}); !slices.Equal(ids, want) || types[len(types)-1] != 1 {
		t.Errorf("empty second text: %v %v, want %v", ids, types, want)
	}
	ids, types, _ = tok.EncodePair("the", "world", false)
	if want := slices.Concat(a, b); !slices.Equal(ids, want) || types[0] != 0 || types[len(types)-1] != 1 {
		t.Errorf("without special tokens: %v %v, want %v", ids, types, want)
	}

	var m map[string]any
	readJSON(t, filepath.Join("testdata", "wordpiece", "tokenizer.json"), &m)
	m["post_processor"] = map[string]any{"type": "RobertaProcessing", "sep": []any{"[SEP]", sep}, "cls": []any{"[CLS]", cls}, "trim_offsets": true, "add_prefix_space": false}
	data, _ := json.Marshal(m)
	roberta, err := FromJSON(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids, types, _ = roberta.EncodePair("The", "World", true)
	wantIDs = slices.Concat([]int32{cls}, a, []int32{sep, sep}, b, []int32{sep})
	if !slices.Equal(ids, wantIDs) || slices.ContainsFunc(types, func(x int32) bool { return x != 0 }) {
		t.Errorf("RobertaProcessing pair = %v %v; want %v, all type 0", ids, types, wantIDs)
	}
	if single, _ := roberta.Encode("The", true); !slices.Equal(single, slices.Concat([]int32{cls}, a, []int32{sep})) {
		t.Errorf("RobertaProcessing single = %v", single)
	}

	m["post_processor"] = nil
	data, _ = json.Marshal(m)
	plain, err := FromJSON(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := plain.EncodePair("a", "b", true); !errors.Is(err, ErrUnsupported) {
		t.Errorf("EncodePair without a pair form: err = %v, want ErrUnsupported", err)
	}
}

// TestTinyWordPiece loads testdata/wordpiece/tiny, the smallest shape of a
// BERT checkpoint's tokenizer files (a 220-token vocabulary, BertNormalizer,
// BertPreTokenizer, BertProcessing, WordPiece decoder), and checks its
// encodings token by token.
func TestTinyWordPiece(t *testing.T) {
	tok, err := Load(filepath.Join("testdata", "wordpiece", "tiny"))
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != 220 {
		t.Errorf("VocabSize = %d, want 220", tok.VocabSize())
	}
	cases := []struct {
		text   string
		tokens []string
		decode string
	}{
		{"Hello, World! The quick brown fox.", []string{"[CLS]", "hello", ",", "world", "!", "the", "quick", "brown", "fox", ".", "[SEP]"},
			"hello, world! the quick brown fox."},
		{"Jumping dogs", []string{"[CLS]", "j", "##u", "##m", "##p", "##ing", "dog", "##s", "[SEP]"}, "jumping dogs"},
		{"Café  déjà-vu", []string{"[CLS]", "c", "##a", "##f", "##e", "d", "##e", "##j", "##a", "-", "v", "##u", "[SEP]"}, "cafe deja - vu"},
		{"日本 [MASK]\tok", []string{"[CLS]", "[UNK]", "[UNK]", "[MASK]", "o", "##k", "[SEP]"}, "ok"}, // [UNK] and [MASK] are special: skipped
		{"", []string{"[CLS]", "[SEP]"}, ""},
	}
	for _, c := range cases {
		got, err := tok.Encode(c.text, true)
		want := tokenIDs(t, tok, c.tokens...)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, %v; want %v %v", c.text, got, err, c.tokens, want)
		}
		if dec, err := tok.Decode(got, true); err != nil || dec != c.decode {
			t.Errorf("Decode(Encode(%q)) = %q, %v; want %q", c.text, dec, err, c.decode)
		}
	}
	if dec, _ := tok.Decode(tokenIDs(t, tok, "[CLS]", "the", "[SEP]"), false); dec != "[CLS] the [SEP]" {
		t.Errorf("Decode with specials = %q", dec)
	}
}

// TestWordPieceBadFiles: WordPiece files that cannot work are refused with
// a *FileError naming the field.
func TestWordPieceBadFiles(t *testing.T) {
	base, err := os.ReadFile(filepath.Join("testdata", "wordpiece", "tiny", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	edit := func(f func(m, model map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(base, &m); err != nil {
			t.Fatal(err)
		}
		f(m, m["model"].(map[string]any))
		out, _ := json.Marshal(m)
		return out
	}
	cases := []struct {
		name, field string
		tok         []byte
		sentinel    error
	}{
		{"unk missing", "model.unk_token", edit(func(_, md map[string]any) { md["unk_token"] = "<unk>" }), ErrMalformed},
		{"no vocab", "model.vocab", edit(func(_, md map[string]any) { delete(md, "vocab") }), ErrMalformed},
		{"negative limit", "model.max_input_chars_per_word", edit(func(_, md map[string]any) { md["max_input_chars_per_word"] = -1 }), ErrMalformed},
		{"bad id", "model.vocab", edit(func(_, md map[string]any) { md["vocab"].(map[string]any)["zz"] = -3 }), ErrMalformed},
		{"limit type", "model", edit(func(_, md map[string]any) { md["max_input_chars_per_word"] = "many" }), ErrMalformed},
		{"byte level", "model.type", edit(func(m, _ map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "ByteLevel"} }), ErrUnsupported},
		{"cls id", "post_processor", edit(func(m, _ map[string]any) { m["post_processor"].(map[string]any)["cls"] = []any{"[CLS]", 9999} }), ErrMalformed},
	}
	for _, c := range cases {
		_, err := FromJSON(c.tok, nil)
		var fe *FileError
		if !errors.As(err, &fe) || !errors.Is(err, c.sentinel) || fe.Field != c.field {
			t.Errorf("%s: got %v; want field %q wrapping %v", c.name, err, c.field, c.sentinel)
		}
	}
}

// naiveWordPiece is Hugging Face's WordPiece::tokenize written out
// directly: every candidate substring, prefixed with "##" after the first
// piece, looked up in the whole vocabulary.
func naiveWordPiece(vocab map[string]int32, unk int32, maxChars int, word string) []int32 {
	if utf8.RuneCountInString(word) > maxChars {
		return []int32{unk}
	}
	var out []int32
	for start := 0; start < len(word); {
		end := len(word)
		found := false
		for start < end {
			sub := word[start:end]
			if start > 0 {
				sub = "##" + sub
			}
			if id, ok := vocab[sub]; ok {
				out = append(out, id)
				found = true
				break
			}
			_, size := utf8.DecodeLastRuneInString(word[start:end])
			end -= size
		}
		if !found {
			return []int32{unk}
		}
		start = end
	}
	return out
}

// FuzzWordPieceModel: the model's lookups (tries, continuing tokens keyed
// without their prefix, the word cache) give exactly the ids of the
// direct algorithm.
func FuzzWordPieceModel(f *testing.F) {
	for _, s := range []string{"tokenization", "unaffable", "##ing", "a", "中文", "x" + strings.Repeat("y", 120), "naïve", "\u0301e", "ab##cd"} {
		f.Add(s)
	}
	tok := wordPieceTokenizer(f, "bert_strip")
	m := tok.words.(*wordPieceModel)
	f.Fuzz(func(t *testing.T, word string) {
		if !utf8.ValidString(word) {
			return
		}
		for range 2 { // the second time from the cache
			if got, want := m.encodeWord(nil, word), naiveWordPiece(tok.tokens, m.unk, m.maxChars, word); !slices.Equal(got, want) && word != "" {
				t.Fatalf("encodeWord(%q) = %v, want %v", word, got, want)
			}
		}
	})
}

// FuzzBertNormalizer: normalizing a space-ended chunk at a time, ASCII
// chunks in one pass, gives the text the four steps give on the whole
// input, for every combination of the options.
func FuzzBertNormalizer(f *testing.F) {
	for _, s := range []string{"Héllo  Wörld\t\x00x", "a\u0301 b\u0301\u0327", " \u0301", "中文 ΣΟΣ İ\r\n", "ABC def", "e \u0308\u0308 x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		for mask := range 16 {
			clean, chinese, strip, lower := mask&1 != 0, mask&2 != 0, mask&4 != 0, mask&8 != 0
			want := s
			if clean {
				want = bertCleanText(want)
			}
			if chinese {
				want = bertSpaceChinese(want)
			}
			if strip {
				want = bertStripAccents(want)
			}
			if lower {
				want = bertLowercase(want)
			}
			n := newBertNormalizer(bertNormalizerSpec{CleanText: &clean, HandleChineseChars: &chinese, StripAccents: &strip, Lowercase: &lower})
			if got := n(s); got != want {
				t.Fatalf("options %04b: normalize(%q) = %q, want %q", mask, s, got, want)
			}
		}
	})
}

// TestEncodeTruncated: right truncation keeps the special tokens, as
// sentence-transformers' max_seq_length cut does.
func TestEncodeTruncated(t *testing.T) {
	tok := wordPieceTokenizer(t, "bert_uncased")
	full, _ := tok.Encode("the quick brown fox jumps over the lazy dog", true)
	for _, max := range []int{3, 5, len(full) - 1, len(full), len(full) + 10} {
		got, truncated, err := tok.EncodeTruncated("the quick brown fox jumps over the lazy dog", max)
		if err != nil {
			t.Fatal(err)
		}
		want := full
		if max < len(full) {
			want = append(append([]int32(nil), full[:max-1]...), full[len(full)-1])
		}
		if !slices.Equal(got, want) || truncated != (max < len(full)) {
			t.Errorf("max %d: %v (truncated %v), want %v", max, got, truncated, want)
		}
	}
	if _, _, err := tok.EncodeTruncated("x", 2); !errors.Is(err, ErrTooShort) {
		t.Errorf("max 2 with [CLS] and [SEP]: err = %v, want ErrTooShort", err)
	}
}

package testmodel

import (
	"fmt"
	"sort"
	"strings"
	"unicode"
)

// BERT's vocabulary starts with [PAD], 99 unused slots, then [UNK],
// [CLS], [SEP] and [MASK] (ids 0, 100 to 103), as bert-base-uncased and
// the checkpoints built on it (bge, all-MiniLM) have it.
const (
	bertPad, bertUnk, bertCLS, bertSep, bertMask = 0, 100, 101, 102, 103
	bertUnused                                   = 99
)

// minWordPieceVocab holds the special tokens, the unused slots, every
// printable lowercase ASCII character and the "##" form of each letter and
// digit, so any ASCII text encodes without [UNK].
var minWordPieceVocab = len(wordPieceChars()) + 104 + 36

// wordPieceChars are the printable ASCII characters a lowercasing
// tokenizer keeps.
func wordPieceChars() []string {
	var out []string
	for r := '!'; r <= '~'; r++ {
		if r < 'A' || r > 'Z' {
			out = append(out, string(r))
		}
	}
	return out
}

// buildWordPiece is a BERT uncased tokenizer: the special tokens, every
// character and its "##" continuation, then the corpus's words by
// frequency until vocabSize or the corpus runs out (rows past it are
// valid ids no text encodes to).
func buildWordPiece(vocabSize int) *tokenizer {
	t := &tokenizer{wordPiece: true, cls: bertCLS, sep: bertSep, pad: bertPad, bos: bertCLS, eos: []int{bertSep}}
	t.vocab = append(t.vocab, "[PAD]")
	for i := range bertUnused {
		t.vocab = append(t.vocab, fmt.Sprintf("[unused%d]", i))
	}
	t.vocab = append(t.vocab, "[UNK]", "[CLS]", "[SEP]", "[MASK]")
	t.names = []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
	t.special = []int{bertPad, bertUnk, bertCLS, bertSep, bertMask}
	seen := map[string]bool{}
	for _, s := range t.vocab {
		seen[s] = true
	}
	add := func(s string) {
		if !seen[s] && len(t.vocab) < vocabSize {
			seen[s] = true
			t.vocab = append(t.vocab, s)
		}
	}
	for _, c := range wordPieceChars() {
		add(c)
	}
	for _, c := range wordPieceChars() {
		if r := rune(c[0]); unicode.IsLetter(r) || unicode.IsDigit(r) {
			add("##" + c)
		}
	}
	freq := map[string]int{}
	for _, w := range strings.FieldsFunc(strings.ToLower(corpus), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	}) {
		if len(w) > 1 {
			freq[w]++
		}
	}
	words := make([]string, 0, len(freq))
	for w := range freq {
		words = append(words, w)
	}
	sort.Slice(words, func(i, j int) bool {
		if freq[words[i]] != freq[words[j]] {
			return freq[words[i]] > freq[words[j]]
		}
		return words[i] < words[j]
	})
	for _, w := range words {
		add(w)
	}
	return t
}

// wordPieceJSON is a BERT uncased tokenizer.json: BertNormalizer
// (lowercase, accents stripped with it), BertPreTokenizer (whitespace and
// punctuation), WordPiece with "##" continuations, [CLS] A [SEP].
func (t *tokenizer) wordPieceJSON() any {
	return map[string]any{
		"version":      "1.0",
		"truncation":   nil,
		"padding":      nil,
		"added_tokens": t.addedTokens(),
		"normalizer": map[string]any{
			"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
			"strip_accents": nil, "lowercase": true,
		},
		"pre_tokenizer":  map[string]any{"type": "BertPreTokenizer"},
		"post_processor": t.clsTemplate(),
		"decoder":        map[string]any{"type": "WordPiece", "prefix": "##", "cleanup": true},
		"model": map[string]any{
			"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
			"max_input_chars_per_word": 100, "vocab": t.orderedVocab(),
		},
	}
}

// vocabTxt is BERT's vocab.txt: one token a line, in id order.
func (t *tokenizer) vocabTxt() []byte {
	return []byte(strings.Join(t.vocab, "\n") + "\n")
}

// encoderConfigJSON is an encoder's tokenizer_config.json:
// BertTokenizer's (uncased) or ModernBERT's fast tokenizer's.
func (t *tokenizer) encoderConfigJSON(decoder map[string]any, contextLength int) any {
	m := map[string]any{
		"added_tokens_decoder":         decoder,
		"clean_up_tokenization_spaces": true,
		"cls_token":                    "[CLS]",
		"mask_token":                   "[MASK]",
		"pad_token":                    "[PAD]",
		"sep_token":                    "[SEP]",
		"unk_token":                    "[UNK]",
		"model_max_length":             contextLength,
		"model_input_names":            []string{"input_ids", "attention_mask"},
		"tokenizer_class":              "PreTrainedTokenizerFast",
	}
	if t.wordPiece {
		delete(m, "model_input_names")
		m["tokenizer_class"] = "BertTokenizer"
		m["do_basic_tokenize"] = true
		m["do_lower_case"] = true
		m["never_split"] = nil
		m["strip_accents"] = nil
		m["tokenize_chinese_chars"] = true
	}
	return m
}

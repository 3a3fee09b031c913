package tokenizer

import (
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// wordModel turns one pre-tokenized word into ids: BPE, WordPiece or
// Unigram.
type wordModel interface {
	encodeWord(dst []int32, word string) []int32
}

// defaultMaxInputCharsPerWord is Hugging Face's WordPiece default.
const defaultMaxInputCharsPerWord = 100

// wordPieceModel is BERT's greedy longest-match-first WordPiece: a word
// is cut into the longest vocabulary token at its start, then the longest
// continuing-subword token ("##...") at each following position; a word
// with any position that matches nothing, or longer than maxChars
// characters, becomes the single unknown token.
type wordPieceModel struct {
	start    *byteTrie // tokens that may begin a word (the whole vocabulary)
	cont     *byteTrie // continuing tokens, keyed without the prefix
	unk      int32
	maxChars int
	cache    *wordCache
}

type wordPieceSpec struct {
	Vocab                   map[string]int32 `json:"vocab"`
	UnkToken                *string          `json:"unk_token"`
	ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
	MaxInputCharsPerWord    *int             `json:"max_input_chars_per_word"`
}

func (t *Tokenizer) buildWordPiece(raw json.RawMessage) error {
	var ms wordPieceSpec
	if err := json.Unmarshal(raw, &ms); err != nil {
		return specErr("model", ErrMalformed, "%v", err)
	}
	if ms.Vocab == nil {
		return specErr("model.vocab", ErrMalformed, "missing")
	}
	prefix := "##"
	if ms.ContinuingSubwordPrefix != nil {
		prefix = *ms.ContinuingSubwordPrefix
	}
	m := &wordPieceModel{maxChars: defaultMaxInputCharsPerWord, cache: newWordCache()}
	if ms.MaxInputCharsPerWord != nil {
		if *ms.MaxInputCharsPerWord < 0 {
			return specErr("model.max_input_chars_per_word", ErrMalformed, "%d is negative", *ms.MaxInputCharsPerWord)
		}
		m.maxChars = *ms.MaxInputCharsPerWord
	}
	unk := "[UNK]"
	if ms.UnkToken != nil {
		unk = *ms.UnkToken
	}
	id, ok := ms.Vocab[unk]
	if !ok {
		// Hugging Face fails at encode time on the first unknown word; a
		// tokenizer that cannot encode arbitrary text is refused here.
		return specErr("model.unk_token", ErrMalformed, "%q is not in the vocabulary", unk)
	}
	m.unk = id
	cont := ms.Vocab
	if prefix != "" {
		cont = make(map[string]int32)
	}
	for tok, id := range ms.Vocab {
		if id < 0 || id >= maxTokenID {
			return specErr("model.vocab", ErrMalformed, "token %q has id %d outside [0, %d)", tok, id, maxTokenID)
		}
		t.noteID(id)
		if rest, ok := strings.CutPrefix(tok, prefix); ok && prefix != "" {
			cont[rest] = id
		}
	}
	m.start, m.cont = newByteTrie(ms.Vocab), newByteTrie(cont)
	t.tokens = ms.Vocab
	t.words = m
	return nil
}

// encodeWord appends the WordPiece ids of one word, as Hugging Face's
// WordPiece::tokenize: the character limit first, then greedy longest
// matches on character boundaries.
func (m *wordPieceModel) encodeWord(dst []int32, word string) []int32 {
	if word == "" {
		return dst
	}
	if utf8.RuneCountInString(word) > m.maxChars {
		return append(dst, m.unk)
	}
	if len(word) > maxCachedWord {
		return m.match(dst, word)
	}
	if ids, ok := m.cache.get(word); ok {
		return append(dst, ids...)
	}
	n := len(dst)
	dst = m.match(dst, word)
	m.cache.put(word, append([]int32(nil), dst[n:]...))
	return dst
}

// match is the greedy longest-match loop: from each position, the
// longest vocabulary token (a continuing one after the first) that the
// word goes on with. Tokens are valid UTF-8, so matches end on character
// boundaries, as Hugging Face's character-by-character shortening does.
func (m *wordPieceModel) match(dst []int32, word string) []int32 {
	n := len(dst)
	trie := m.start
	for start := 0; start < len(word); {
		id, end := int32(-1), start
		for node, i := int32(0), start; i < len(word); {
			if node = trie.step(node, word[i]); node < 0 {
				break
			}
			i++
			if v := trie.val[node]; v >= 0 {
				id, end = v, i
			}
		}
		if id < 0 {
			return append(dst[:n], m.unk)
		}
		dst = append(dst, id)
		start = end
		trie = m.cont
	}
	return dst
}

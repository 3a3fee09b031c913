package tokenizer

import (
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// wordModel turns one pre-tokenized word into ids: BPE or WordPiece.
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
	start    map[string]int32 // tokens that may begin a word (the whole vocabulary)
	cont     map[string]int32 // continuing tokens, keyed without the prefix
	unk      int32
	maxChars int
	maxLen   int // longest key of start or cont in bytes: no longer match exists
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
	m := &wordPieceModel{start: ms.Vocab, maxChars: defaultMaxInputCharsPerWord, cache: newWordCache()}
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
	m.cont = ms.Vocab
	if prefix != "" {
		m.cont = make(map[string]int32)
	}
	for tok, id := range ms.Vocab {
		if id < 0 || id >= maxTokenID {
			return specErr("model.vocab", ErrMalformed, "token %q has id %d outside [0, %d)", tok, id, maxTokenID)
		}
		t.noteID(id)
		m.maxLen = max(m.maxLen, len(tok))
		if rest, ok := strings.CutPrefix(tok, prefix); ok && prefix != "" {
			m.cont[rest] = id
		}
	}
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

// match is the greedy longest-match loop.
func (m *wordPieceModel) match(dst []int32, word string) []int32 {
	n := len(dst)
	vocab := m.start
	for start := 0; start < len(word); {
		end := min(len(word), start+m.maxLen)
		for end > start && !utf8.RuneStart(wordByte(word, end)) {
			end--
		}
		found := false
		for end > start {
			if id, ok := vocab[word[start:end]]; ok {
				dst = append(dst, id)
				found = true
				break
			}
			_, size := utf8.DecodeLastRuneInString(word[start:end])
			end -= size
		}
		if !found {
			return append(dst[:n], m.unk)
		}
		start = end
		vocab = m.cont
	}
	return dst
}

// wordByte is word[i], or a rune-start byte at the end of the word.
func wordByte(word string, i int) byte {
	if i >= len(word) {
		return 0
	}
	return word[i]
}

package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// Tokenizer turns text into token ids and back, renders chat templates and
// makes streaming decoders. It is immutable after Load and safe for
// concurrent use. Make one with Load or FromJSON; the zero value is not
// usable.
type Tokenizer struct {
	bl             *byteLevelTable
	normalizers    []normalizer
	pre            preTokenizer // nil: the whole segment is one word
	spaceSplit     string       // see encodeSpaceWords; "" when unsafe
	model          *bpeModel    // nil unless the model is BPE
	words          wordModel    // the model: BPE (model), WordPiece or Unigram
	added          *addedMatcher
	addedByID      map[int32]*addedToken
	addedByContent map[string]int32
	post           *postPlan
	dec            *decodePlan
	tokens         map[string]int32 // vocabulary in tokenizer.json's spelling
	vocabSize      int
	pieces         [][]byte         // decoded bytes of each id
	firstPieces    map[int32][]byte // bytes of an id that starts the output, where they differ (WordPiece, Metaspace)
	special        []bool           // id is a special added token

	bos              int32
	hasBOS           bool
	eos              []int32
	addBOS, addEOS   bool
	templates        *chatTemplates
	bosText, eosText string
}

// Encode turns text into token ids. Added and special tokens written in
// text (such as "<|im_start|>") are matched before anything else and become
// their ids. With addSpecial the post-processor's tokens are added (or, when
// tokenizer.json has none, the BOS/EOS tokens tokenizer_config.json asks
// for with add_bos_token/add_eos_token). Text that is not valid UTF-8 gives
// a *UTF8Error.
func (t *Tokenizer) Encode(text string, addSpecial bool) ([]int32, error) {
	if !utf8.ValidString(text) {
		off := 0
		for off < len(text) {
			r, size := utf8.DecodeRuneInString(text[off:])
			if r == utf8.RuneError && size <= 1 {
				break
			}
			off += size
		}
		return nil, &UTF8Error{Offset: off}
	}
	ids := make([]int32, 0, len(text)/3+4)
	if addSpecial {
		ids = append(ids, t.specialPrefix()...)
	}
	first := true
	for _, seg := range t.added.split(text) {
		if seg.id >= 0 {
			ids = append(ids, seg.id)
		} else {
			ids = t.encodeSegment(ids, seg.text, first)
		}
		first = false
	}
	if addSpecial {
		ids = append(ids, t.specialSuffix()...)
	}
	return ids, nil
}

func (t *Tokenizer) specialPrefix() []int32 {
	if t.post.set {
		return t.post.prefix
	}
	if t.addBOS && t.hasBOS {
		return []int32{t.bos}
	}
	return nil
}

func (t *Tokenizer) specialSuffix() []int32 {
	if t.post.set {
		return t.post.suffix
	}
	if t.addEOS && len(t.eos) > 0 {
		return t.eos[:1]
	}
	return nil
}

// encodeSegment normalizes, pre-tokenizes and BPE-encodes plain text.
func (t *Tokenizer) encodeSegment(dst []int32, s string, first bool) []int32 {
	for _, n := range t.normalizers {
		s = n(s)
	}
	if s == "" {
		return dst
	}
	if t.pre == nil {
		if t.spaceSplit != "" {
			return t.encodeSpaceWords(dst, s)
		}
		return t.words.encodeWord(dst, s)
	}
	var buf [64]string
	for _, w := range t.pre.split(buf[:0], s, first) {
		dst = t.words.encodeWord(dst, w)
	}
	return dst
}

// encodeSpaceWords encodes a SentencePiece-style segment word by word,
// cutting before each replacement rune that follows another character.
// Load enables this only when no vocabulary token holds the replacement
// rune after another character, so no merge can span a cut and the result
// is exactly that of encoding the whole segment as one word, with the word
// cache to help.
func (t *Tokenizer) encodeSpaceWords(dst []int32, s string) []int32 {
	sep := t.spaceSplit
	start := 0
	for i := 0; i < len(s); {
		j := strings.Index(s[i:], sep)
		if j < 0 {
			break
		}
		i += j
		if i > start && !strings.HasSuffix(s[:i], sep) {
			dst = t.model.encodeWord(dst, s[start:i])
			start = i
		}
		i += len(sep)
	}
	return t.model.encodeWord(dst, s[start:])
}

// Decode turns ids into text. With skipSpecial, special added tokens (BOS,
// EOS, chat markers) produce nothing. Bytes that do not form valid UTF-8
// become U+FFFD. Ids outside [0, VocabSize()) give ErrInvalidToken.
// Decode does not apply transformers' clean_up_tokenization_spaces: text
// comes back exactly as the tokens spell it.
func (t *Tokenizer) Decode(ids []int32, skipSpecial bool) (string, error) {
	raw := make([]byte, 0, len(ids)*4)
	strip := t.dec.stripStart
	first := true
	for _, id := range ids {
		piece, ok, err := t.piece(id, skipSpecial)
		if err != nil {
			return "", err
		}
		if !ok {
			continue
		}
		piece, strip = t.firstPiece(id, piece, strip, first)
		first = false
		raw, strip = appendPiece(raw, piece, strip)
	}
	if utf8.Valid(raw) {
		return string(raw), nil
	}
	out, _ := lossyAppend(make([]byte, 0, len(raw)+8), raw, true)
	return string(out), nil
}

// piece returns id's bytes; ok is false when the id produces no text.
func (t *Tokenizer) piece(id int32, skipSpecial bool) ([]byte, bool, error) {
	if id < 0 || int(id) >= len(t.pieces) {
		return nil, false, &InvalidTokenError{ID: id, VocabSize: t.vocabSize}
	}
	if skipSpecial && t.special[id] {
		return nil, false, nil
	}
	return t.pieces[id], true, nil
}

// firstPiece returns the bytes of the token that starts the output: the
// WordPiece decoder writes that token as it is spelled (a leading "##"
// stays), every later one with the prefix cut or a space before it; the
// Metaspace decoder drops every "▁" of that token, later ones become
// spaces.
func (t *Tokenizer) firstPiece(id int32, piece []byte, strip int, first bool) ([]byte, int) {
	if first && t.firstPieces != nil {
		if p, ok := t.firstPieces[id]; ok {
			return p, 0
		}
	}
	return piece, strip
}

// appendPiece appends a token's bytes. strip is how many leading spaces
// the decoder still removes from the start of the output (its Strip or
// Metaspace step); it drops to zero once anything else is written.
func appendPiece(dst, piece []byte, strip int) ([]byte, int) {
	for strip > 0 && len(piece) > 0 && piece[0] == ' ' {
		piece = piece[1:]
		strip--
	}
	if len(piece) == 0 {
		return dst, strip
	}
	return append(dst, piece...), 0
}

// VocabSize is the number of token ids: one more than the largest id in
// the vocabulary or the added tokens.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// BOS returns the beginning-of-sequence token named by tokenizer_config.json;
// ok is false when there is none.
func (t *Tokenizer) BOS() (int32, bool) { return t.bos, t.hasBOS }

// EOS returns the end-of-sequence tokens named by tokenizer_config.json's
// eos_token (a string or a list), without duplicates. The caller must not
// modify the slice.
func (t *Tokenizer) EOS() []int32 { return t.eos }

// TokenID looks a token up by its spelling in tokenizer.json (added tokens
// included, e.g. "<|eot_id|>"; byte-level tokens as written there, e.g.
// "Ġthe").
func (t *Tokenizer) TokenID(token string) (int32, bool) {
	if id, ok := t.addedByContent[token]; ok {
		return id, true
	}
	id, ok := t.tokens[token]
	return id, ok
}

// IsSpecial reports whether id is a special added token (such as BOS or
// EOS), the tokens Decode skips with skipSpecial.
func (t *Tokenizer) IsSpecial(id int32) bool {
	return id >= 0 && int(id) < len(t.special) && t.special[id]
}

// TokenBytes returns the bytes id decodes to on its own (nil for ids
// outside the vocabulary). Constrained decoding matches these against a
// grammar. The caller must not modify the slice.
func (t *Tokenizer) TokenBytes(id int32) []byte {
	if id < 0 || int(id) >= len(t.pieces) {
		return nil
	}
	return t.pieces[id]
}

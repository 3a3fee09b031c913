package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// bertNormalizerSpec is tokenizer.json's BertNormalizer. Missing fields
// take Hugging Face's defaults (clean_text, handle_chinese_chars and
// lowercase true; strip_accents null, meaning "as lowercase").
type bertNormalizerSpec struct {
	CleanText          *bool `json:"clean_text"`
	HandleChineseChars *bool `json:"handle_chinese_chars"`
	StripAccents       *bool `json:"strip_accents"`
	Lowercase          *bool `json:"lowercase"`
}

// newBertNormalizer compiles a BertNormalizer into the steps Hugging Face
// runs, in its order: clean text, space out CJK ideographs, strip accents
// (NFD, then drop nonspacing marks), lowercase.
func newBertNormalizer(s bertNormalizerSpec) normalizer {
	clean := boolOr(s.CleanText, true)
	chinese := boolOr(s.HandleChineseChars, true)
	lower := boolOr(s.Lowercase, true)
	strip := boolOr(s.StripAccents, lower)
	steps := func(text string) string {
		if clean {
			text = bertCleanText(text)
		}
		if chinese {
			text = bertSpaceChinese(text)
		}
		if strip {
			text = bertStripAccents(text)
		}
		if lower {
			text = bertLowercase(text)
		}
		return text
	}
	return func(text string) string {
		// Every step works character by character, except NFD's
		// reordering of combining marks, which never crosses a space
		// (a starter): the text is normalized a space-ended chunk at a
		// time, ASCII chunks in one pass.
		b := make([]byte, 0, len(text)+len(text)/8)
		for text != "" {
			chunk := text
			if i := strings.IndexByte(text, ' '); i >= 0 {
				chunk = text[:i+1]
			}
			text = text[len(chunk):]
			if isASCII(chunk) {
				b = appendBertASCII(b, chunk, clean, lower)
			} else {
				b = append(b, steps(chunk)...)
			}
		}
		return string(b)
	}
}

// appendBertASCII is the BertNormalizer on ASCII text: controls dropped
// and tab, newline and carriage return made spaces (clean), letters
// lowercased (lower); nothing else applies to ASCII.
func appendBertASCII(b []byte, s string, clean, lower bool) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case clean && (c == '\t' || c == '\n' || c == '\r'):
			c = ' '
		case clean && (c < ' ' || c == 0x7f):
			continue
		case lower && 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return b
}

// bertCleanText drops NUL, U+FFFD and control characters (categories Cc,
// Cf and Co, except tab, newline and carriage return) and turns every
// whitespace character into a space.
func bertCleanText(s string) string {
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r >= utf8.RuneSelf || r < ' ' || r == 0x7f {
			break
		}
		i += size
	}
	if i == len(s) {
		return s // printable ASCII: nothing to do
	}
	var b strings.Builder
	b.Grow(len(s))
	b.WriteString(s[:i])
	for _, r := range s[i:] {
		switch {
		case r == 0 || r == utf8.RuneError || bertIsControl(r):
		case bertIsWhitespace(r):
			b.WriteByte(' ')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// bertIsWhitespace is Hugging Face's is_whitespace: tab, newline, carriage
// return and the Unicode White_Space characters (Rust's char::is_whitespace).
func bertIsWhitespace(r rune) bool {
	if r < utf8.RuneSelf {
		return r == ' ' || (r >= '\t' && r <= '\r')
	}
	return unicode.Is(unicode.White_Space, r)
}

// bertIsControl is Hugging Face's is_control: categories Cc, Cf and Co
// except tab, newline and carriage return.
func bertIsControl(r rune) bool {
	if r < utf8.RuneSelf {
		return (r < ' ' && r != '\t' && r != '\n' && r != '\r') || r == 0x7f
	}
	return (r >= 0x80 && r <= 0x9f) || unicode.In(r, unicode.Cf, unicode.Co)
}

// isChineseChar reports whether r is in a CJK ideograph block, the
// ranges Hugging Face's BertNormalizer spaces out.
func isChineseChar(r rune) bool {
	switch {
	case r >= 0x4E00 && r <= 0x9FFF, r >= 0x3400 && r <= 0x4DBF,
		r >= 0x20000 && r <= 0x2A6DF, r >= 0x2A700 && r <= 0x2B73F,
		r >= 0x2B740 && r <= 0x2B81F, r >= 0x2B920 && r <= 0x2CEAF,
		r >= 0xF900 && r <= 0xFAFF, r >= 0x2F800 && r <= 0x2FA1F:
		return true
	}
	return false
}

func bertSpaceChinese(s string) string {
	n := 0
	for _, r := range s {
		if isChineseChar(r) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	for _, r := range s {
		if isChineseChar(r) {
			b.WriteByte(' ')
			b.WriteRune(r)
			b.WriteByte(' ')
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// bertStripAccents decomposes to NFD and drops nonspacing marks (Mn).
func bertStripAccents(s string) string {
	if isASCII(s) {
		return s
	}
	s = norm.NFD.String(s)
	return strings.Map(func(r rune) rune {
		if unicode.Is(unicode.Mn, r) {
			return -1
		}
		return r
	}, s)
}

// bertLowercase lowercases character by character with the full Unicode
// mapping, as Rust's char::to_lowercase: no context rules (a final capital
// sigma becomes σ, not ς), and İ becomes "i" plus U+0307, the one
// unconditional mapping to more than one character.
func bertLowercase(s string) string {
	if isASCII(s) {
		return strings.ToLower(s)
	}
	var b strings.Builder
	b.Grow(len(s) + 4)
	for _, r := range s {
		if r == 'İ' {
			b.WriteString("i\u0307")
			continue
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// bertPre is the BertPreTokenizer: split on whitespace (dropped), then cut
// every punctuation character (ASCII punctuation or a Unicode P* category)
// into a word of its own.
type bertPre struct{}

func (bertPre) split(dst []string, s string, _ bool) []string {
	start := -1 // start of the current word, -1 when between words
	for i, r := range s {
		switch {
		case bertIsWhitespace(r):
			if start >= 0 {
				dst = append(dst, s[start:i])
				start = -1
			}
		case isBertPunct(r):
			if start >= 0 {
				dst = append(dst, s[start:i])
				start = -1
			}
			dst = append(dst, s[i:i+utf8.RuneLen(r)])
		default:
			if start < 0 {
				start = i
			}
		}
	}
	if start >= 0 {
		dst = append(dst, s[start:])
	}
	return dst
}

func isBertPunct(r rune) bool {
	if r < utf8.RuneSelf {
		return r > ' ' && r < 0x7f && !('0' <= r && r <= '9' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z')
	}
	return unicode.IsPunct(r)
}

// wordPieceCleanup is the WordPiece decoder's cleanup: the spaces the
// decoder put before punctuation and English contractions come out again.
func wordPieceCleanup(s string) string {
	for _, r := range [...][2]string{
		{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
		{" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
	} {
		s = strings.ReplaceAll(s, r[0], r[1])
	}
	return s
}

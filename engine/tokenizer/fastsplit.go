package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// Hand-written matchers for the split patterns of GPT-2, Llama 3 and
// Qwen2/3. They give exactly the regular expressions' matches (tests and
// FuzzFastSplit compare them with regexp2) at a fraction of the cost.
const (
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// fastSplitter returns a hand-written matcher for a known pre-tokenizer
// pattern with Isolated behavior, or nil to use the regular expression.
func fastSplitter(pattern string, behavior splitBehavior) func(dst []string, s string) []string {
	if behavior != splitIsolated {
		return nil
	}
	switch pattern {
	case llama3Pattern:
		return func(dst []string, s string) []string { return splitLlama(dst, s, 3) }
	case qwen2Pattern:
		return func(dst []string, s string) []string { return splitLlama(dst, s, 1) }
	case gpt2Pattern:
		return splitGPT2
	}
	return nil
}

// runeClass classifies runes as the patterns see them.
type runeClass uint8

const (
	clsOther runeClass = iota
	clsLetter
	clsNumber
	clsSpace // \s other than \r and \n
	clsCRLF  // \r or \n
)

var asciiClass = func() (t [utf8.RuneSelf]runeClass) {
	for r := range rune(utf8.RuneSelf) {
		switch {
		case r == '\r' || r == '\n':
			t[r] = clsCRLF
		case unicode.IsSpace(r):
			t[r] = clsSpace
		case unicode.IsLetter(r):
			t[r] = clsLetter
		case unicode.IsNumber(r):
			t[r] = clsNumber
		}
	}
	return t
}()

func classOf(r rune) runeClass {
	if r < utf8.RuneSelf {
		return asciiClass[r]
	}
	switch {
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	case unicode.IsSpace(r):
		return clsSpace
	}
	return clsOther
}

// at decodes the rune at byte offset i; size 0 at the end.
func at(s string, i int) (runeClass, rune, int) {
	if i >= len(s) {
		return clsOther, 0, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], rune(c), 1
	}
	r, size := utf8.DecodeRuneInString(s[i:])
	return classOf(r), r, size
}

// run advances over runes of class cls from i, at most max of them (max <=
// 0: no limit), returning the end offset.
func run(s string, i int, cls runeClass, max int) int {
	for n := 0; max <= 0 || n < max; n++ {
		c, _, size := at(s, i)
		if size == 0 || c != cls {
			break
		}
		i += size
	}
	return i
}

// runSpace advances over \s (both space classes).
func runSpace(s string, i int) int {
	for {
		c, _, size := at(s, i)
		if size == 0 || (c != clsSpace && c != clsCRLF) {
			return i
		}
		i += size
	}
}

// contraction matches 's 't 're 've 'm 'll 'd at i; caseless when fold.
func contraction(s string, i int, fold bool) int {
	if i >= len(s) || s[i] != '\'' || i+1 >= len(s) {
		return 0
	}
	lower := func(b byte) byte {
		if fold && b >= 'A' && b <= 'Z' {
			return b + 32
		}
		return b
	}
	switch lower(s[i+1]) {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v':
		if i+2 < len(s) && lower(s[i+2]) == 'e' {
			return 3
		}
	case 'l':
		if i+2 < len(s) && lower(s[i+2]) == 'l' {
			return 3
		}
	}
	return 0
}

// splitLlama matches the Llama 3 pattern (maxDigits 3) or the Qwen2 one
// (maxDigits 1).
func splitLlama(dst []string, s string, maxDigits int) []string {
	for i := 0; i < len(s); {
		end := matchLlama(s, i, maxDigits)
		dst = append(dst, s[i:end])
		i = end
	}
	return dst
}

func matchLlama(s string, i, maxDigits int) int {
	if n := contraction(s, i, true); n > 0 {
		return i + n
	}
	c, r, size := at(s, i)
	switch c {
	case clsLetter:
		return run(s, i, clsLetter, 0)
	case clsNumber:
		return run(s, i, clsNumber, maxDigits)
	case clsOther, clsSpace:
		if next, _, _ := at(s, i+size); next == clsLetter {
			return run(s, i+size, clsLetter, 0) // [^\r\n\p{L}\p{N}]?\p{L}+
		}
	}
	if c == clsOther || (r == ' ' && isOther(s, i+1)) {
		j := i
		if r == ' ' {
			j++
		}
		j = run(s, j, clsOther, 0)
		return run(s, j, clsCRLF, 0) // ?[^\s\p{L}\p{N}]+[\r\n]*
	}
	return matchSpaces(s, i, true)
}

func isOther(s string, i int) bool {
	c, _, size := at(s, i)
	return size > 0 && c == clsOther
}

// matchSpaces handles the whitespace alternatives at i (a \s rune):
// \s*[\r\n]+ (when crlf), then \s+(?!\S), then \s+.
func matchSpaces(s string, i int, crlf bool) int {
	j := runSpace(s, i)
	if crlf {
		lastNL := -1
		for k := i; k < j; k++ {
			if s[k] == '\r' || s[k] == '\n' {
				lastNL = k
			}
		}
		if lastNL >= 0 {
			return lastNL + 1
		}
	}
	if j == len(s) {
		return j
	}
	// Back off the last whitespace rune so that it is followed by space.
	_, last := utf8.DecodeLastRuneInString(s[:j])
	if j-last > i {
		return j - last
	}
	return j
}

// splitGPT2 matches the GPT-2 pattern used by the ByteLevel pre-tokenizer.
func splitGPT2(dst []string, s string) []string {
	for i := 0; i < len(s); {
		end := matchGPT2(s, i)
		dst = append(dst, s[i:end])
		i = end
	}
	return dst
}

func matchGPT2(s string, i int) int {
	if n := contraction(s, i, false); n > 0 {
		return i + n
	}
	j := i
	if s[i] == ' ' {
		j++
	}
	if c, _, size := at(s, j); size > 0 && c != clsSpace && c != clsCRLF {
		return run(s, j, c, 0) // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
	}
	return matchSpaces(s, i, false)
}

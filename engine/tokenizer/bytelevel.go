package tokenizer

import "unicode/utf8"

// byteLevelChars maps each byte to the printable rune GPT-2's byte-level
// BPE writes it as; byteLevelBytes is the inverse.
type byteLevelTable struct {
	chars [256]rune
	bytes map[rune]byte
}

func newByteLevelTable() *byteLevelTable {
	t := &byteLevelTable{bytes: make(map[rune]byte, 256)}
	n := 0
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			t.chars[b] = rune(b)
		} else {
			t.chars[b] = rune(256 + n)
			n++
		}
		t.bytes[t.chars[b]] = byte(b)
	}
	return t
}

// toBytes converts a byte-level token string to the raw bytes it stands
// for. ok is false when a rune is outside the byte-level alphabet; raw
// then holds the string's own UTF-8 bytes (as Hugging Face's decoder does).
func (t *byteLevelTable) toBytes(s string) (raw []byte, ok bool) {
	raw = make([]byte, 0, len(s))
	for _, r := range s {
		b, found := t.bytes[r]
		if !found {
			return []byte(s), false
		}
		raw = append(raw, b)
	}
	return raw, true
}

// gpt2Pattern is the split regex the ByteLevel pre-tokenizer uses when
// use_regex is set.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// lossyAppend appends src to dst as valid UTF-8, replacing each maximal
// invalid subpart with U+FFFD as Rust's String::from_utf8_lossy does. When
// final is false, an incomplete but so far valid sequence at the end of src
// is left unconsumed; n is the number of bytes of src consumed.
func lossyAppend(dst []byte, src []byte, final bool) (out []byte, n int) {
	i := 0
	for i < len(src) {
		c := src[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(src[i:])
		if r != utf8.RuneError || size > 1 {
			dst = append(dst, src[i:i+size]...)
			i += size
			continue
		}
		k, want := validPrefix(src[i:])
		if k == len(src)-i && k < want && !final {
			return dst, i
		}
		if k == 0 {
			k = 1
		}
		dst = append(dst, "\uFFFD"...)
		i += k
	}
	return dst, i
}

// validPrefix returns how many leading bytes of b form a valid (possibly
// incomplete) UTF-8 sequence and how long the full sequence would be.
func validPrefix(b []byte) (k, want int) {
	c := b[0]
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		want = 2
	case c == 0xE0:
		want, lo = 3, 0xA0
	case c == 0xED:
		want, hi = 3, 0x9F
	case c >= 0xE1 && c <= 0xEF:
		want = 3
	case c == 0xF0:
		want, lo = 4, 0x90
	case c == 0xF4:
		want, hi = 4, 0x8F
	case c >= 0xF1 && c <= 0xF3:
		want = 4
	default:
		return 0, 1
	}
	k = 1
	for k < want && k < len(b) {
		if b[k] < lo || b[k] > hi {
			break
		}
		lo, hi = 0x80, 0xBF
		k++
	}
	return k, want
}

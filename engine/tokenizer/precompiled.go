package tokenizer

import (
	"encoding/base64"
	"encoding/binary"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// precompiled is the Precompiled normalizer: a SentencePiece character
// map (a darts-clone double-array trie over UTF-8 keys, then the
// NUL-terminated replacement strings), applied as Hugging Face's
// spm_precompiled does. Each grapheme cluster shorter than 6 bytes is
// looked up whole, and if any prefix of it is a key, the whole cluster
// becomes the replacement of the shortest such prefix; otherwise (and for
// longer clusters) each character is looked up on its own.
type precompiled struct {
	array      []uint32
	normalized string
}

func newPrecompiled(charsmap, field string) (*precompiled, error) {
	raw, err := base64.StdEncoding.DecodeString(charsmap)
	if err != nil {
		return nil, specErr(field, ErrMalformed, "precompiled_charsmap is not base64: %v", err)
	}
	if len(raw) < 4 {
		return nil, specErr(field, ErrMalformed, "precompiled_charsmap is too short")
	}
	size := int(binary.LittleEndian.Uint32(raw))
	if size%4 != 0 || size > len(raw)-4 || size == 0 {
		return nil, specErr(field, ErrMalformed, "precompiled_charsmap trie size %d does not fit its %d bytes", size, len(raw))
	}
	p := &precompiled{array: make([]uint32, size/4)}
	for i := range p.array {
		p.array[i] = binary.LittleEndian.Uint32(raw[4+4*i:])
	}
	p.normalized = string(raw[4+size:])
	if !utf8.ValidString(p.normalized) {
		return nil, specErr(field, ErrMalformed, "precompiled_charsmap replacements are not UTF-8")
	}
	return p, nil
}

// shortestMatch returns the replacement of the shortest key that is a
// prefix of key (darts-clone's common prefix search, first result).
func (p *precompiled) shortestMatch(key string) (string, bool) {
	unitOffset := func(u uint32) uint32 { return (u >> 10) << ((u & (1 << 9)) >> 6) }
	pos := unitOffset(p.array[0])
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c == 0 {
			break
		}
		pos ^= uint32(c)
		if int(pos) >= len(p.array) {
			return "", false
		}
		u := p.array[pos]
		if u&((1<<31)|0xFF) != uint32(c) {
			return "", false
		}
		pos ^= unitOffset(u)
		if int(pos) >= len(p.array) {
			return "", false
		}
		if (u>>8)&1 == 1 {
			start := int(p.array[pos] & (1<<31 - 1))
			if start > len(p.normalized) {
				return "", false
			}
			end := strings.IndexByte(p.normalized[start:], 0)
			if end < 0 {
				end = len(p.normalized) - start
			}
			return p.normalized[start : start+end], true
		}
	}
	return "", false
}

func (p *precompiled) normalize(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for s != "" {
		g := s[:graphemeLen(s)]
		s = s[len(g):]
		if len(g) < 6 {
			if rep, ok := p.shortestMatch(g); ok {
				b.WriteString(rep)
				continue
			}
		}
		for i := 0; i < len(g); {
			_, size := utf8.DecodeRuneInString(g[i:])
			c := g[i : i+size]
			i += size
			if rep, ok := p.shortestMatch(c); ok {
				b.WriteString(rep)
			} else {
				b.WriteString(c)
			}
		}
	}
	return b.String()
}

// newRegexReplace is the Replace normalizer with a Regex pattern: every
// match becomes content, literally. XLM-RoBERTa's " {2,}" (runs of
// spaces to one) has a direct loop.
func newRegexReplace(pattern, content, field string) (normalizer, error) {
	if pattern == " {2,}" {
		return func(s string) string {
			if !strings.Contains(s, "  ") {
				return s
			}
			var b strings.Builder
			for s != "" {
				i := strings.Index(s, "  ")
				if i < 0 {
					b.WriteString(s)
					break
				}
				b.WriteString(s[:i])
				b.WriteString(content)
				s = strings.TrimLeft(s[i:], " ")
			}
			return b.String()
		}, nil
	}
	re, err := regexp2.Compile(pattern, regexp2.Unicode)
	if err != nil {
		return nil, specErr(field, ErrUnsupported, "regex %q: %v", pattern, err)
	}
	return func(s string) string {
		out, err := re.ReplaceFunc(s, func(regexp2.Match) string { return content }, -1, -1)
		if err != nil {
			return s
		}
		return out
	}, nil
}

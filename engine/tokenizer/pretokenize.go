package tokenizer

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// preTokenizer splits one piece of normalized text into words. first is
// set for the segment that starts the input (Metaspace's "first" scheme).
type preTokenizer interface {
	split(dst []string, s string, first bool) []string
}

// sequencePre applies stages one after another, each to every piece the
// previous stage produced.
type sequencePre []preTokenizer

func (q sequencePre) split(dst []string, s string, first bool) []string {
	words := []string{s}
	for _, st := range q {
		next := make([]string, 0, len(words)*2)
		for _, w := range words {
			next = st.split(next, w, first)
		}
		words = next
	}
	return append(dst, words...)
}

// splitBehavior says what a Split pre-tokenizer does with its matches.
type splitBehavior int

const (
	splitIsolated splitBehavior = iota
	splitRemoved
	splitMergedWithPrevious
	splitMergedWithNext
)

// regexSplit splits on a regular expression's matches.
type regexSplit struct {
	re       *regexp2.Regexp
	fast     func(dst []string, s string) []string // hand-written matcher for known patterns
	behavior splitBehavior
}

func newRegexSplit(pattern string, behavior splitBehavior, field string) (*regexSplit, error) {
	re, err := regexp2.Compile(pattern, regexp2.Unicode)
	if err != nil {
		return nil, specErr(field, ErrUnsupported, "regex %q: %v", pattern, err)
	}
	return &regexSplit{re: re, behavior: behavior, fast: fastSplitter(pattern, behavior)}, nil
}

func (r *regexSplit) split(dst []string, s string, _ bool) []string {
	if s == "" {
		return dst
	}
	if r.fast != nil {
		return r.fast(dst, s)
	}
	return r.splitRegex(dst, s)
}

// splitRegex runs the regular expression. regexp2 reports rune offsets;
// they are turned into byte offsets as the scan moves along.
func (r *regexSplit) splitRegex(dst []string, s string) []string {
	runes := []rune(s)
	bytePos, runePos := 0, 0
	advance := func(to int) int {
		for runePos < to {
			bytePos += utf8.RuneLen(runes[runePos])
			runePos++
		}
		return bytePos
	}
	var spans [][2]int
	m, err := r.re.FindRunesMatch(runes)
	for err == nil && m != nil {
		if m.Length > 0 {
			start := advance(m.Index)
			spans = append(spans, [2]int{start, advance(m.Index + m.Length)})
		}
		m, err = r.re.FindNextMatch(m)
	}
	return appendPieces(dst, s, spans, r.behavior)
}

// appendPieces cuts s at the match spans as behavior says.
func appendPieces(dst []string, s string, spans [][2]int, behavior splitBehavior) []string {
	last := 0
	for _, sp := range spans {
		start, end := sp[0], sp[1]
		switch behavior {
		case splitIsolated, splitRemoved:
			if start > last {
				dst = append(dst, s[last:start])
			}
			if behavior == splitIsolated {
				dst = append(dst, s[start:end])
			}
			last = end
		case splitMergedWithPrevious:
			dst = append(dst, s[last:end])
			last = end
		case splitMergedWithNext:
			if start > last {
				dst = append(dst, s[last:start])
			}
			last = start
		}
	}
	if last < len(s) {
		dst = append(dst, s[last:])
	}
	return dst
}

// byteLevelPre is the ByteLevel pre-tokenizer. The byte-to-rune mapping
// itself is folded into the vocabulary at load time, so only the prefix
// space and the optional GPT-2 split remain.
type byteLevelPre struct {
	addPrefixSpace bool
	re             *regexSplit // nil unless use_regex
}

func (b *byteLevelPre) split(dst []string, s string, first bool) []string {
	if b.addPrefixSpace && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	if b.re == nil {
		if s == "" {
			return dst
		}
		return append(dst, s)
	}
	return b.re.split(dst, s, first)
}

// metaspacePre replaces spaces with the replacement rune, prepends one as
// its scheme asks, and optionally splits before each replacement rune.
type metaspacePre struct {
	replacement string
	scheme      string // "always", "first", "never"
	splitWords  bool
}

func (m *metaspacePre) split(dst []string, s string, first bool) []string {
	s = strings.ReplaceAll(s, " ", m.replacement)
	if (m.scheme == "always" || (m.scheme == "first" && first)) && !strings.HasPrefix(s, m.replacement) {
		s = m.replacement + s
	}
	if s == "" {
		return dst
	}
	if !m.splitWords {
		return append(dst, s)
	}
	start := 0
	for i := 1; i < len(s); {
		j := strings.Index(s[i:], m.replacement)
		if j < 0 {
			break
		}
		i += j
		if i > start {
			dst = append(dst, s[start:i])
		}
		start = i
		i += len(m.replacement)
	}
	return append(dst, s[start:])
}

// digitsPre splits digits from other characters, and from each other when
// individual is set.
type digitsPre struct{ individual bool }

func (d digitsPre) split(dst []string, s string, _ bool) []string {
	start := 0
	prevDigit := false
	for i, r := range s {
		isDigit := unicode.IsDigit(r)
		if i > start && (isDigit != prevDigit || (isDigit && d.individual)) {
			dst = append(dst, s[start:i])
			start = i
		}
		prevDigit = isDigit
	}
	if start < len(s) {
		dst = append(dst, s[start:])
	}
	return dst
}

// whitespaceSplitPre splits on whitespace, dropping it.
type whitespaceSplitPre struct{}

func (whitespaceSplitPre) split(dst []string, s string, _ bool) []string {
	return append(dst, strings.Fields(s)...)
}

func parseBehavior(b, field string) (splitBehavior, error) {
	switch strings.ToLower(b) {
	case "isolated":
		return splitIsolated, nil
	case "removed":
		return splitRemoved, nil
	case "mergedwithprevious":
		return splitMergedWithPrevious, nil
	case "mergedwithnext":
		return splitMergedWithNext, nil
	}
	return 0, specErr(field, ErrUnsupported, "split behavior %q", b)
}

func boolOr(p *bool, def bool) bool {
	if p == nil {
		return def
	}
	return *p
}

// parsePreTokenizer builds a pre-tokenizer; byteLevel reports whether a
// ByteLevel stage is present (the vocabulary is then byte-level).
func parsePreTokenizer(c *componentSpec, field string) (p preTokenizer, byteLevel bool, err error) {
	switch c.Type {
	case "Sequence":
		var seq sequencePre
		for i, raw := range c.Pretokenizers {
			f := fmt.Sprintf("%s.pretokenizers[%d]", field, i)
			sub, err := parseComponent(raw, f)
			if err != nil {
				return nil, false, err
			}
			st, bl, err := parsePreTokenizer(sub, f)
			if err != nil {
				return nil, false, err
			}
			byteLevel = byteLevel || bl
			if b, ok := st.(*byteLevelPre); ok && !b.addPrefixSpace && b.re == nil {
				continue // only the byte mapping, which the vocabulary already holds
			}
			seq = append(seq, st)
		}
		if len(seq) == 1 {
			return seq[0], byteLevel, nil
		}
		return seq, byteLevel, nil
	case "Split":
		if c.Invert {
			return nil, false, specErr(field, ErrUnsupported, "inverted Split")
		}
		if c.Pattern == nil || (c.Pattern.Regex == nil && c.Pattern.String == nil) {
			return nil, false, specErr(field, ErrMalformed, "Split without a pattern")
		}
		beh, err := parseBehavior(c.Behavior, field)
		if err != nil {
			return nil, false, err
		}
		pat := ""
		if c.Pattern.Regex != nil {
			pat = *c.Pattern.Regex
		} else {
			pat = regexp2.Escape(*c.Pattern.String)
		}
		rs, err := newRegexSplit(pat, beh, field)
		return rs, false, err
	case "ByteLevel":
		b := &byteLevelPre{addPrefixSpace: boolOr(c.AddPrefixSpace, true)}
		if boolOr(c.UseRegex, true) {
			rs, err := newRegexSplit(gpt2Pattern, splitIsolated, field)
			if err != nil {
				return nil, false, err
			}
			b.re = rs
		}
		return b, true, nil
	case "Metaspace":
		m, err := newMetaspace(c, field)
		return m, false, err
	case "Digits":
		return digitsPre{individual: c.IndividualDigits}, false, nil
	case "WhitespaceSplit":
		return whitespaceSplitPre{}, false, nil
	case "BertPreTokenizer":
		return bertPre{}, false, nil
	}
	return nil, false, specErr(field, ErrUnsupported, "pre-tokenizer type %q", c.Type)
}

func newMetaspace(c *componentSpec, field string) (*metaspacePre, error) {
	m := &metaspacePre{replacement: c.Replacement, scheme: c.PrependScheme, splitWords: boolOr(c.Split, true)}
	if m.replacement == "" {
		m.replacement = "\u2581"
	}
	if m.scheme == "" {
		m.scheme = "always"
		if !boolOr(c.AddPrefixSpace, true) {
			m.scheme = "never"
		}
	}
	switch m.scheme {
	case "always", "first", "never":
		return m, nil
	}
	return nil, specErr(field, ErrUnsupported, "Metaspace prepend_scheme %q", m.scheme)
}

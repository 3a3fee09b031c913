package tokenizer

import (
	"slices"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's added_tokens.
type addedToken struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// addedMatcher finds added tokens written in text, leftmost first and the
// longest at each position, before any normalization or BPE.
type addedMatcher struct {
	lengths [256][]int // distinct content lengths by first byte, longest first
	byText  map[string]*addedToken
}

func newAddedMatcher(tokens []addedToken) *addedMatcher {
	m := &addedMatcher{byText: make(map[string]*addedToken, len(tokens))}
	for i := range tokens {
		t := &tokens[i]
		if t.Content == "" {
			continue
		}
		m.byText[t.Content] = t
		c := t.Content[0]
		if !slices.Contains(m.lengths[c], len(t.Content)) {
			m.lengths[c] = append(m.lengths[c], len(t.Content))
		}
	}
	for i := range m.lengths {
		sort.Sort(sort.Reverse(sort.IntSlice(m.lengths[i])))
	}
	return m
}

// segment is a piece of input: plain text, or an added token (id >= 0).
type segment struct {
	text string
	id   int32
}

// split cuts text into plain and added-token segments.
func (m *addedMatcher) split(text string) []segment {
	var segs []segment
	last := 0
	for i := 0; i < len(text); i++ {
		lengths := m.lengths[text[i]]
		if len(lengths) == 0 {
			continue
		}
		tok := m.matchAt(text, i, lengths)
		if tok == nil {
			continue
		}
		start, end := i, i+len(tok.Content)
		if tok.LStrip {
			start = last + len(strings.TrimRightFunc(text[last:start], unicode.IsSpace))
		}
		if tok.RStrip {
			end = len(text) - len(strings.TrimLeftFunc(text[end:], unicode.IsSpace))
		}
		if start > last {
			segs = append(segs, segment{text: text[last:start], id: -1})
		}
		segs = append(segs, segment{id: tok.ID})
		last = end
		i = end - 1
	}
	if last < len(text) || len(segs) == 0 {
		segs = append(segs, segment{text: text[last:], id: -1})
	}
	return segs
}

func (m *addedMatcher) matchAt(text string, i int, lengths []int) *addedToken {
	for _, n := range lengths {
		if i+n > len(text) {
			continue
		}
		t, ok := m.byText[text[i:i+n]]
		if !ok {
			continue
		}
		if t.SingleWord && !isWordBoundary(text, i, i+len(t.Content)) {
			continue
		}
		return t
	}
	return nil
}

// isWordBoundary reports whether [start,end) is not glued to word
// characters on either side.
func isWordBoundary(text string, start, end int) bool {
	if start > 0 {
		r, _ := utf8.DecodeLastRuneInString(text[:start])
		if isWordRune(r) {
			return false
		}
	}
	if end < len(text) {
		r, _ := utf8.DecodeRuneInString(text[end:])
		if isWordRune(r) {
			return false
		}
	}
	return true
}

func isWordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

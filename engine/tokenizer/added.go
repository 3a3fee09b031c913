package tokenizer

import (
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
	byFirst [256][]*addedToken // candidates by first byte, longest first
}

func newAddedMatcher(tokens []addedToken) *addedMatcher {
	m := &addedMatcher{}
	for i := range tokens {
		t := &tokens[i]
		if t.Content == "" {
			continue
		}
		c := t.Content[0]
		m.byFirst[c] = append(m.byFirst[c], t)
	}
	for i := range m.byFirst {
		sort.SliceStable(m.byFirst[i], func(a, b int) bool {
			return len(m.byFirst[i][a].Content) > len(m.byFirst[i][b].Content)
		})
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
		cands := m.byFirst[text[i]]
		if len(cands) == 0 {
			continue
		}
		tok := m.matchAt(text, i, cands)
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

func (m *addedMatcher) matchAt(text string, i int, cands []*addedToken) *addedToken {
	for _, t := range cands {
		if !strings.HasPrefix(text[i:], t.Content) {
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

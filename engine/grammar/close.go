package grammar

import (
	"bytes"
	"encoding/binary"
	"slices"
	"unsafe"
)

// Closing a document within a token budget.
//
// The closing run of a matcher's state is the shortest text that completes
// the document from there (found by a breadth-first search through the
// walker over printable ASCII, so every limit and bound the mask enforces
// holds for it), cut into the longest tokens of the vocabulary. Its length
// is the closing distance: a state from which the document can be closed
// in that many sampled tokens. Runs are cached per grammar by a key of
// the state that leaves out what closing does not depend on (whitespace
// runs, value counts, characters already in a free string, items past
// the minimum), so that the states a document passes through share them.

// closeCacheSize bounds the closing runs a grammar keeps.
const closeCacheSize = 8192

// closeSearchWidth caps the states a closing search keeps per byte of
// depth: past it the search keeps the first found, so the run found is
// still valid, if perhaps not the shortest (numbers with wide bounds).
const closeSearchWidth = 256

// closeSearchDepth caps the bytes of a closing run.
const closeSearchDepth = 4096

// closeMargin is the slack, in tokens, past the closing distance and the
// grammar's largest opening within which FillMaskWithin checks every
// token allowed.
const closeMargin = 4

// closeRun is a cached closing run: ok false when the search found none.
type closeRun struct {
	toks []int32
	ok   bool
}

// closeKey appends a key of states for the closing-run cache.
func closeKey(buf []byte, states []*stk, closing bool) []byte {
	if closing {
		buf = append(buf, 1)
	} else {
		buf = append(buf, 0)
	}
	for _, s := range states {
		for ; s != nil; s = s.up {
			buf = frameKey(buf, &s.f)
		}
		buf = append(buf, 0xff)
	}
	return buf
}

func frameKey(buf []byte, f *frame) []byte {
	i, j, room := f.i, f.j, int32(0)
	n := f.n
	lit := ""
	switch f.kind {
	case fString:
		if f.re == nil {
			i = max(0, int32(n.minLen)-f.i) // characters still needed
			room = min(f.maxChars-f.i, i)
		} else {
			room = f.maxChars - f.i
		}
	case fArray:
		i = min(i, int32(n.minItems))
	case fObject:
		if n.free {
			i = min(i, int32(n.minProps))
		} else if f.st == oKey {
			lit = f.lit
		}
	case fNumber:
		if n.bounded() {
			lit = f.lit
		} else {
			i, j = 0, 0
		}
	case fLit:
		lit = f.lit
	}
	buf = append(buf, byte(f.kind), f.st, f.depth, f.u8need, f.u8lo, f.u8hi, f.u8n)
	buf = append(buf, f.u8buf[:]...)
	if f.surr {
		buf = append(buf, 1)
	} else {
		buf = append(buf, 0)
	}
	buf = binary.LittleEndian.AppendUint64(buf, uint64(uintptr(unsafe.Pointer(n))))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(uintptr(unsafe.Pointer(f.re))))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(i))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(j))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(room))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(lit)))
	return append(buf, lit...)
}

// closeRunOf returns the closing run of states (see above), from the
// grammar's cache or by a search.
func (g *Grammar) closeRunOf(states []*stk, closing bool, key []byte) closeRun {
	if r, ok := g.closes.Get(string(key)); ok {
		return r
	}
	r := closeRun{}
	if text, ok := g.closeText(states, closing); ok {
		r.toks, r.ok = g.v.greedyTokens(text)
	}
	g.closes.Add(string(key), r)
	return r
}

// closeText returns the shortest bytes after which the document may end,
// over the readings in states.
func (g *Grammar) closeText(states []*stk, closing bool) ([]byte, bool) {
	var best []byte
	found := false
	for _, s := range states {
		if t, ok := g.stackText(s, closing, 0); ok && (!found || len(t) < len(best)) {
			best, found = t, true
		}
	}
	return best, found
}

// closeText is a cached closing text: ok false when none was found.
type closeText struct {
	text []byte
	ok   bool
}

// maxLeafChain bounds the leaf frames stackText finishes one after the
// other before it searches the rest as a whole.
const maxLeafChain = 8

// stackText returns the shortest closing text of one reading. A reading
// whose top frame is a leaf (a string, number, literal or declared key)
// finishes that frame first and closes the rest from where that leaves
// it, so that the readings of the tokens that differ only inside a
// string or a number share the rest's text.
func (g *Grammar) stackText(s *stk, closing bool, chain int) ([]byte, bool) {
	if canEnd(s) {
		return nil, true
	}
	key := string(closeKey(nil, []*stk{s}, closing))
	if t, ok := g.texts.Get(key); ok {
		return t.text, t.ok
	}
	var t closeText
	w := walker{g: g, closing: closing}
	if leaf(&s.f) && chain < maxLeafChain {
		if head, rest, ok := g.search(&w, s, true); ok {
			if tail, ok := g.stackText(rest, closing, chain+1); ok {
				t = closeText{text: append(head, tail...), ok: true}
			}
		}
	} else {
		t.text, _, t.ok = g.search(&w, s, false)
	}
	g.texts.Add(key, t)
	return t.text, t.ok
}

// leaf reports whether f can only end or go on by itself, never holding
// another value: a string, a number, a literal, a declared key.
func leaf(f *frame) bool {
	return f.kind == fString || f.kind == fNumber || f.kind == fLit || f.kind == fObject && f.st == oKey
}

// search finds the shortest bytes from s to a reading where the document
// may end or, with finish, where s's top frame (a leaf) is done; rest is
// that reading (a finished number popped).
func (g *Grammar) search(w *walker, s *stk, finish bool) (text []byte, rest *stk, ok bool) {
	type node struct {
		s    *stk
		prev int32
		c    byte
	}
	goal := func(ns *stk) (*stk, bool) {
		switch {
		case canEnd(ns):
			return ns, true
		case !finish:
			return nil, false
		case s.f.kind == fNumber:
			if ns.f.kind == fNumber && numFinal(&ns.f) {
				return w.pop(ns), true
			}
			return nil, false
		}
		return ns, !leaf(&ns.f)
	}
	if r, ok := goal(s); ok {
		return nil, r, true
	}
	nodes := make([]node, 1, 64)
	nodes[0] = node{s: s, prev: -1}
	seen := map[string]bool{}
	key := closeKey(nil, []*stk{s}, false)
	seen[string(key)] = true
	var out []*stk
	var alpha []byte
	for lo, depth := 0, 0; lo < len(nodes) && depth < closeSearchDepth; depth++ {
		hi := len(nodes)
		for k := lo; k < hi && len(nodes)-hi < closeSearchWidth; k++ {
			for _, c := range w.closeBytes(nodes[k].s, alpha[:0]) {
				out = w.adv(nodes[k].s, c, out[:0])
				for _, ns := range out {
					key = closeKey(key[:0], []*stk{ns}, false)
					if seen[string(key)] {
						continue
					}
					seen[string(key)] = true
					nodes = append(nodes, node{s: ns, prev: int32(k), c: c})
					if r, ok := goal(ns); ok {
						for at := int32(len(nodes) - 1); nodes[at].prev >= 0; at = nodes[at].prev {
							text = append(text, nodes[at].c)
						}
						slices.Reverse(text)
						return text, r, true
					}
				}
				if len(nodes)-hi >= closeSearchWidth {
					break
				}
			}
		}
		lo = hi
	}
	return nil, nil, false
}

// closeBytes appends the bytes a closing search tries after s: the next
// byte of a literal or key; in a string, its end and what it still needs
// (characters up to its minimum length, the bytes that take a pattern
// closest to a match, the rest of an escape or a character); elsewhere
// every printable ASCII byte (whitespace never shortens a closing).
func (w *walker) closeBytes(s *stk, out []byte) []byte {
	f := &s.f
	switch {
	case f.kind == fLit || f.kind == fObject && f.st == oKey:
		return append(out, f.lit[f.i])
	case f.kind == fValue && f.n.kind == kAny:
		return append(out, '0')
	case f.kind != fString:
		return append(out, closeAlphabet...)
	case f.st == sEsc:
		return append(out, 'n')
	case f.st == sHex:
		return append(out, '0')
	case f.u8need > 0 && f.re == nil:
		return append(out, f.u8lo)
	case f.u8need > 0:
		for c := int(f.u8lo); c <= int(f.u8hi); c++ {
			out = append(out, byte(c))
		}
		return out
	}
	out = append(out, '"')
	if f.re == nil {
		return append(out, 'a')
	}
	if c, ok := w.g.reNext.Load(f.re); ok {
		if c := c.(int); c >= 0 {
			return append(out, byte(c))
		}
	} else {
		next := -1
		var buf [maxStacks]*stk
	probe:
		for c := byte(0x20); c <= 0x7e; c++ {
			if c == '"' || c == '\\' {
				continue
			}
			for _, ns := range w.adv(s, c, buf[:0]) {
				if ns.f.re != nil && ns.f.re.dist < f.re.dist {
					next = int(c)
					break probe
				}
			}
		}
		w.g.reNext.Store(f.re, next)
		if next >= 0 {
			return append(out, byte(next))
		}
	}
	for c := byte(0x20); c <= 0x7e; c++ {
		out = append(out, c)
	}
	for c := byte(0xC2); c <= 0xF4; c++ {
		out = append(out, c)
	}
	return out
}

// closeAlphabet is printable ASCII, closers first: a search cut at its
// width keeps the states that end values.
var closeAlphabet = func() []byte {
	b := []byte(`}]",:0`)
	for c := byte(0x21); c <= 0x7e; c++ {
		if !bytes.ContainsRune(b[:6], rune(c)) {
			b = append(b, c)
		}
	}
	return b
}()

// greedyTokens cuts text into the longest tokens of the vocabulary that
// sampling may produce; ok is false when some byte has no token.
func (v *Vocab) greedyTokens(text []byte) ([]int32, bool) {
	t := &v.all
	var toks []int32
	for off := 0; off < len(text); {
		node, best, bestLen := int32(0), int32(-1), 0
		for d := off; d < len(text); d++ {
			next := int32(-1)
			for e := t.edgeStart[node]; e < t.edgeStart[node+1]; e++ {
				if t.edgeByte[e] == text[d] {
					next = t.edgeNode[e]
					break
				}
			}
			if next < 0 {
				break
			}
			node = next
			if t.tokStart[node] < t.tokStart[node+1] {
				best, bestLen = t.toks[t.tokStart[node]], d+1-off
			}
		}
		if best < 0 {
			return nil, false
		}
		toks = append(toks, best)
		off += bestLen
	}
	return toks, true
}

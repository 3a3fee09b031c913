package grammar

import "slices"

// Inside a plain string (no pattern) the fate of the rest of a token does
// not depend on where the string sits: its bytes either stay inside the
// string, needing some number of characters of the string's budget, or
// close it after some characters and leave the bytes after the quote to
// whatever holds the string. strInfo records that for every token below
// one trie node, so the mask walk replaces a subtree of thousands of
// tokens by a budget test and a short walk of the bytes after the quote.

// strInfo classifies the tokens strictly below a trie node, read from
// the start of a string body.
type strInfo struct {
	// Tokens that stay inside the string, by characters needed, ascending.
	insideID   []int32
	insideNeed []int32
	// Tokens that close the string: closers is a trie of the bytes after
	// the quote whose token entries index closeID/closeChars.
	closers    trie
	closeID    []int32
	closeChars []int32
}

const (
	clsInvalid = iota
	clsInside
	clsClose
)

// classify reads s from the start of a plain string body. For clsInside
// need is the characters the string must still have room for; for
// clsClose chars is the characters before the quote and after the rest.
func classify(s []byte) (cls, need int, after []byte) {
	const (
		body = iota
		esc
		hex
		u8
	)
	st, chars, left := body, 0, 0
	var lo, hi byte
	surr := false
	for k, c := range s {
		switch st {
		case esc:
			switch c {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				st = body
				chars++
			case 'u':
				st, left, surr = hex, 4, false
			default:
				return clsInvalid, 0, nil
			}
		case hex:
			if !isHex(c) {
				return clsInvalid, 0, nil
			}
			if left == 4 {
				surr = c == 'd' || c == 'D'
			} else if left == 3 && surr && (c >= '8' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return clsInvalid, 0, nil
			}
			if left--; left == 0 {
				st = body
				chars++
			}
		case u8:
			if c < lo || c > hi {
				return clsInvalid, 0, nil
			}
			lo, hi = 0x80, 0xBF
			if left--; left == 0 {
				st = body
				chars++
			}
		default:
			switch {
			case c == '"':
				return clsClose, chars, s[k+1:]
			case c < 0x20:
				return clsInvalid, 0, nil
			case c == '\\':
				st = esc
			case c < 0x80:
				chars++
			default:
				n, l, h := utf8Lead(c)
				if n == 0 {
					return clsInvalid, 0, nil
				}
				st, left, lo, hi = u8, int(n), l, h
			}
		}
	}
	if st != body {
		chars++
	}
	return clsInside, chars, nil
}

// buildStrInfo classifies the tokens below node (at depth bytes) of t.
func buildStrInfo(t *trie, pieces [][]byte, node int32, depth int) *strInfo {
	si := &strInfo{}
	var closeIDs []int32
	var afters [][]byte
	var stack []int32
	for e := t.edgeStart[node]; e < t.edgeStart[node+1]; e++ {
		stack = append(stack, t.edgeNode[e])
	}
	type inside struct{ id, need int32 }
	var ins []inside
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for k := t.tokStart[n]; k < t.tokStart[n+1]; k++ {
			id := t.toks[k]
			cls, need, after := classify(pieces[id][depth:])
			switch cls {
			case clsInside:
				ins = append(ins, inside{id, int32(need)})
			case clsClose:
				si.closeID = append(si.closeID, id)
				si.closeChars = append(si.closeChars, int32(need))
				closeIDs = append(closeIDs, int32(len(closeIDs)))
				afters = append(afters, after)
			}
		}
		for e := t.edgeStart[n]; e < t.edgeStart[n+1]; e++ {
			stack = append(stack, t.edgeNode[e])
		}
	}
	slices.SortFunc(ins, func(a, b inside) int { return int(a.need - b.need) })
	for _, x := range ins {
		si.insideID = append(si.insideID, x.id)
		si.insideNeed = append(si.insideNeed, x.need)
	}
	si.closers = buildTrie(afters, closeIDs)
	return si
}

// stringMask adds to mask the tokens below trie node whose rest is
// allowed by the plain string body on top of s; inside reports the
// tokens that stay inside (nil: use si's lists).
func (m *Matcher) stringMask(si *strInfo, s *stk, mask []uint64, inside [][]uint64) {
	f := &s.f
	r := m.w.room(f)
	if inside != nil {
		if r > 0 {
			for i, w := range inside[min(int(r), len(inside)-1)] {
				mask[i] |= w
			}
		}
	} else {
		for k, need := range si.insideNeed {
			if need > r {
				break
			}
			id := si.insideID[k]
			mask[id>>6] |= 1 << (id & 63)
		}
	}
	if len(si.closeID) == 0 {
		return
	}
	// The string closes: the rest goes to what holds it.
	parent := m.w.pop(s)
	minChars := int32(f.n.minLen) - f.i
	m.closerHits(si, &si.closers, 0, []*stk{parent}, 0, r, minChars, mask)
}

func (m *Matcher) closerHits(si *strInfo, t *trie, node int32, states []*stk, depth int, r, minChars int32, mask []uint64) {
	set := func(n int32) {
		for k := t.tokStart[n]; k < t.tokStart[n+1]; k++ {
			e := t.toks[k]
			if m.filter != nil && m.filter[e>>6]&(1<<(e&63)) == 0 {
				continue
			}
			if c := si.closeChars[e]; c <= r && c >= minChars {
				id := si.closeID[e]
				mask[id>>6] |= 1 << (id & 63)
			}
		}
	}
	if depth == 0 {
		set(0)
	}
	if depth == len(m.cbufs) {
		m.cbufs = append(m.cbufs, make([]*stk, 0, 8))
	}
	for e := t.edgeStart[node]; e < t.edgeStart[node+1]; e++ {
		c := t.edgeByte[e]
		next := m.cbufs[depth][:0]
		for _, s := range states {
			next = m.w.adv(s, c, next)
		}
		m.cbufs[depth] = next
		if len(next) == 0 {
			continue
		}
		child := t.edgeNode[e]
		set(child)
		if t.edgeStart[child] < t.edgeStart[child+1] {
			m.closerHits(si, t, child, next, depth+1, r, minChars, mask)
		}
	}
}

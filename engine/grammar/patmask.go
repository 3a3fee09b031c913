package grammar

import (
	"math/bits"
	"sync"
)

// patInfo is what a pattern state allows from the start of a token, for
// any string and any context: the tokens that stay inside the string
// (before the characters budget is applied), and which of the vocabulary's
// closing tokens end the string on a match.
type patInfo struct {
	// maxTotal is the most characters any inside token needs, counting
	// what the pattern needs after it to match: the fast path is exact
	// only while the string has at least that much room left.
	maxTotal int32
	inside   []uint64
	closeOK  []uint64 // bit e: closer e of the root strInfo
}

// patCache holds the patInfos of one regex's DFA states. A regex
// compiled for a vocabulary (Vocab.regex) is used with that vocabulary
// only, so the cache lives in the regex and goes with it.
type patCache struct {
	mu sync.Mutex
	m  map[*dstate]*patInfo
}

// maxPatInfos caps the patInfos of one regex (16 KB each on a 128k
// vocabulary); states past it are matched by the trie walk.
const maxPatInfos = 512

// patInfo returns what pattern state ds allows, computing it on first use.
func (v *Vocab) patInfo(re *regex, ds *dstate) *patInfo {
	pc := &re.pats
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pi, ok := pc.m[ds]; ok {
		return pi
	}
	if pc.m == nil {
		pc.m = map[*dstate]*patInfo{}
	}
	if len(pc.m) >= maxPatInfos {
		return nil
	}
	pi := &patInfo{inside: make([]uint64, v.words), closeOK: make([]uint64, (len(v.root.closeID)+63)/64)}
	v.patInside(re, ds, 0, patPos{}, 0, pi)
	for e, id := range v.root.closeID {
		if end, ok := patRun(re, ds, v.pieces[id]); ok && end.match {
			pi.closeOK[e>>6] |= 1 << (e & 63)
		}
	}
	pc.m[ds] = pi
	return pi
}

// patPos is a position inside a pattern string: the DFA state and an
// unfinished UTF-8 character.
type patPos struct {
	need   uint8
	lo, hi byte
	n      uint8
	buf    [4]byte
}

// patStep reads c at (ds, p); ok is false when the pattern cannot go on.
func patStep(re *regex, ds *dstate, p patPos, c byte) (*dstate, patPos, bool) {
	if p.need > 0 {
		if c < p.lo || c > p.hi {
			return nil, p, false
		}
		p.buf[p.n] = c
		p.n++
		p.need--
		p.lo, p.hi = 0x80, 0xBF
		if p.need == 0 {
			ds = re.step(ds, decodeRune(p.buf[:p.n]))
			return ds, patPos{}, ds != nil
		}
		lo, hi := partialRange(p.buf[:p.n], p.lo, p.hi, int(p.need))
		return ds, p, re.accepts(ds, [2]rune{lo, hi}, unreachable)
	}
	switch {
	case c == '"' || c == '\\' || c < 0x20:
		return nil, p, false
	case c < 0x80:
		ds = re.step(ds, rune(c))
		return ds, p, ds != nil
	}
	need, lo, hi := utf8Lead(c)
	if need == 0 {
		return nil, p, false
	}
	p = patPos{need: need, lo: lo, hi: hi, n: 1}
	p.buf[0] = c
	lr, hr := partialRange(p.buf[:1], lo, hi, int(need))
	return ds, p, re.accepts(ds, [2]rune{lr, hr}, unreachable)
}

// patInside sets the tokens below node that stay inside a pattern string
// from (ds, p).
func (v *Vocab) patInside(re *regex, ds *dstate, node int32, p patPos, chars int32, pi *patInfo) {
	t := &v.all
	for e := t.edgeStart[node]; e < t.edgeStart[node+1]; e++ {
		c := t.edgeByte[e]
		nds, np, ok := patStep(re, ds, p, c)
		if !ok {
			continue
		}
		nc := chars
		if c < 0x80 || c >= 0xC0 {
			nc++ // a character starts here
		}
		child := t.edgeNode[e]
		if t.tokStart[child] < t.tokStart[child+1] {
			pi.maxTotal = max(pi.maxTotal, nc+nds.dist)
		}
		for k := t.tokStart[child]; k < t.tokStart[child+1]; k++ {
			id := t.toks[k]
			pi.inside[id>>6] |= 1 << (id & 63)
		}
		v.patInside(re, nds, child, np, nc, pi)
	}
}

// patRun reads a closing token's bytes before its quote from ds.
func patRun(re *regex, ds *dstate, tok []byte) (*dstate, bool) {
	var p patPos
	for _, c := range tok {
		if c == '"' {
			return ds, p.need == 0
		}
		var ok bool
		if ds, p, ok = patStep(re, ds, p, c); !ok {
			return nil, false
		}
	}
	return nil, false
}

// patternMask fills the mask of a single pattern string body on top of s
// from the cached patInfo; false when the cache is full.
func (m *Matcher) patternMask(s *stk, mask []uint64) bool {
	v := m.g.v
	f := &s.f
	pi := v.patInfo(f.n.re, f.re)
	r := f.maxChars - f.i
	if pi == nil || r < pi.maxTotal {
		return false
	}
	if r > 0 {
		le := v.insideLE[min(int(r), len(v.insideLE)-1)]
		for i, w := range pi.inside {
			mask[i] |= w & le[i]
		}
	}
	si := v.root
	parent := m.w.pop(s)
	minChars := int32(f.n.minLen) - f.i
	m.closerHitsIf(si, pi.closeOK, parent, r, minChars, mask)
	return true
}

// closerHitsIf is closerHits over the root closers allowed by ok.
func (m *Matcher) closerHitsIf(si *strInfo, ok []uint64, parent *stk, r, minChars int32, mask []uint64) {
	any := false
	for _, w := range ok {
		if bits.OnesCount64(w) > 0 {
			any = true
			break
		}
	}
	if !any {
		return
	}
	m.filter = ok
	m.closerHits(si, &si.closers, 0, []*stk{parent}, 0, r, minChars, mask)
	m.filter = nil
}

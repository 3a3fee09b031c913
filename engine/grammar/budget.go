package grammar

import (
	"bytes"
	"math/bits"
	"sync"
	"unicode/utf8"
)

// openMargin is computed once per grammar: the largest closing run of a
// single value of any schema node under the root, or of a property's key,
// colon and value, the most one token can usually add to the closing
// distance by opening values or picking a property inside its key.
type openMargin struct {
	once sync.Once
	n    int
}

// MinTokens returns the fewest sampled tokens a document of the grammar
// takes (its closing run from the start, see Matcher.ClosingDistance), or
// -1 when none was found.
func (g *Grammar) MinTokens() int { return g.NewMatcher().ClosingDistance() }

// ClosingDistance returns the fewest sampled tokens after which the
// document is complete from here, as the matcher knows them: the
// shortest closing text cut into the vocabulary's longest tokens, each
// one the mask allows at its position. 0 means the document may end now;
// -1 that no closing was found (a pattern that needs bytes outside
// printable ASCII, a vocabulary without single-byte tokens). Runs are
// computed on first use and cached per grammar.
func (m *Matcher) ClosingDistance() int {
	r := m.closing()
	if !r.ok {
		return -1
	}
	return len(r.toks)
}

// closing returns the closing run of the current state, kept by the
// matcher while the tokens accepted follow it.
func (m *Matcher) closing() closeRun {
	if !m.planSet {
		if len(m.states) == 0 {
			m.plan = closeRun{}
		} else {
			m.setClosing()
			m.keyBuf = closeKey(m.keyBuf[:0], m.states, m.w.closing)
			m.plan = m.g.closeRunOf(m.states, m.w.closing, m.keyBuf)
		}
		m.planSet = true
	}
	return m.plan
}

// followPlan updates the kept closing run after token id was accepted.
func (m *Matcher) followPlan(id int32) {
	if m.planSet && m.plan.ok && len(m.plan.toks) > 0 && m.plan.toks[0] == id {
		m.plan.toks = m.plan.toks[1:]
		return
	}
	m.planSet = false
}

// FillMaskWithin is FillMask for a sequence that may take at most budget
// more tokens. While the budget is well above the closing distance it is
// FillMask. Once the budget comes within the distance plus a margin (the
// largest value the schema can open in one token, plus a few tokens), it
// allows only the tokens after which the document can still be closed
// within budget-1 tokens, so that the document is complete when the
// budget runs out; a budget below the distance allows only the first
// token of the closing run. slack is how many more tokens may be accepted
// before the mask can differ from FillMask's (0 once it may); cut reports
// that this mask left out tokens FillMask allows. Without a known
// closing (ClosingDistance -1) it is FillMask with slack budget.
func (m *Matcher) FillMaskWithin(mask []uint64, budget int) (slack int, cut bool) {
	m.FillMask(mask)
	margin := m.g.openMargin()
	// Far from the budget the distance is not looked up at every token:
	// each token accepted since it was known counts as adding the margin.
	if m.est.set && !m.planSet {
		if slack = budget - m.est.d - margin*(1+m.est.since); slack > 0 {
			return slack, false
		}
	}
	run := m.closing()
	m.est.set, m.est.d, m.est.since = true, len(run.toks), 0
	if !run.ok {
		return budget, false
	}
	d := len(run.toks)
	if slack = budget - d - margin; slack > 0 {
		return slack, false
	}
	if d > budget {
		first := run.toks[0]
		kept := mask[first>>6] & (1 << (first & 63))
		clear(mask)
		mask[first>>6] |= kept
		return 0, true
	}
	return 0, m.restrict(mask, budget, run)
}

// restrict clears the tokens of mask after which the closing distance
// exceeds budget-1.
func (m *Matcher) restrict(mask []uint64, budget int, run closeRun) (cut bool) {
	v := m.g.v
	d := len(run.toks)
	// Tokens that stay inside a plain string past its minimum length
	// leave the closing distance as it is.
	var inside, plain []uint64
	if s := m.states[0]; len(m.states) == 1 && plainStringBody(&s.f) && int(s.f.i) >= s.f.n.minLen {
		if room := m.w.room(&s.f); room > 0 {
			inside = v.insideLE[min(int(room), len(v.insideLE)-1)]
			plain = v.plainChars()
		}
	}
	// The readings after each token live in the walker's arena until the
	// next token: only their closing text is kept.
	m.w.pooled = true
	defer func() { m.w.pooled = false }()
	for wi, word := range mask {
		for w := word; w != 0; w &= w - 1 {
			b := bits.TrailingZeros64(w)
			id := int32(wi*64 + b)
			var keep bool
			switch {
			case d > 0 && id == run.toks[0], isEOS(v.eos, id):
				keep = true
			case inside != nil && inside[wi]&plain[wi]&(1<<b) != 0:
				keep = d <= budget-1
			default:
				keep = m.distAfter(v.pieces[id]) <= budget-1
			}
			if !keep {
				mask[wi] &^= 1 << b
				cut = true
			}
		}
	}
	return cut
}

// distAfter returns the closing distance after bytes p, or a large value
// when none is known.
func (m *Matcher) distAfter(p []byte) int {
	const unknown = 1 << 30
	m.w.resetArena()
	cur := m.states
	for len(m.cbufs) < 2 {
		m.cbufs = append(m.cbufs, nil)
	}
	for k, c := range p {
		next := m.cbufs[k&1][:0]
		for _, s := range cur {
			if next = m.w.adv(s, c, next); len(next) > maxStacks {
				next = next[:maxStacks]
			}
		}
		m.cbufs[k&1] = next
		if len(next) == 0 {
			return unknown
		}
		cur = next
	}
	m.keyBuf = closeKey(m.keyBuf[:0], cur, m.w.closing)
	r := m.g.closeRunOf(cur, m.w.closing, m.keyBuf)
	if !r.ok {
		return unknown
	}
	return len(r.toks)
}

// ForcedTokensWithin is ForcedTokens for a sequence that may take at most
// budget more tokens: it returns no more forced tokens than leave the
// document closable within what is left after them.
func (m *Matcher) ForcedTokensWithin(max, budget int) []int32 {
	ids := m.ForcedTokens(max)
	if len(ids) == 0 {
		return ids
	}
	// Far from the budget (see FillMaskWithin) the run fits; near it,
	// most runs do: check the end of the whole run first.
	margin := m.g.openMargin()
	if m.est.set && budget-m.est.d-margin*(2+m.est.since+len(ids)) > 0 {
		return ids
	}
	probe := Matcher{g: m.g, states: m.states, w: walker{g: m.g}, free: m.free}
	for k, id := range ids {
		if probe.Accept(id) != nil {
			ids = ids[:k]
			break
		}
	}
	n := len(ids)
	if d := probe.ClosingDistance(); n == 0 || d <= budget-n { // d -1: unknown
		return ids
	}
	dist := make([]int, n) // the closing distance after ids[:k+1]
	probe = Matcher{g: m.g, states: m.states, w: walker{g: m.g}, free: m.free}
	for k := range n {
		_ = probe.Accept(ids[k])
		dist[k] = probe.ClosingDistance()
	}
	for n > 0 && dist[n-1] > budget-n {
		n--
	}
	return ids[:n]
}

// openMargin returns the grammar's margin (see FillMaskWithin).
func (g *Grammar) openMargin() int {
	g.open.once.Do(func() {
		largest := 0
		eachNode(g.root, func(n *node) {
			if n == g.root {
				return
			}
			root := &stk{f: frame{kind: fRoot}}
			st := []*stk{{f: frame{kind: fValue, n: n}, up: root}}
			if r := g.closeRunOf(st, false, closeKey(nil, st, false)); r.ok {
				largest = max(largest, len(r.toks))
			}
			// A token inside a key may pick a property: the rest of
			// its key (at most a token a byte), the colon and its
			// value at once.
			for _, p := range n.props {
				pst := []*stk{{f: frame{kind: fValue, n: p.n}, up: root}}
				if r := g.closeRunOf(pst, false, closeKey(nil, pst, false)); r.ok {
					largest = max(largest, len(p.key)+1+len(r.toks))
				}
			}
		})
		g.open.n = largest + closeMargin
	})
	return g.open.n
}

// plainChars returns the tokens made of whole characters that need no
// escape in a JSON string (built on first use): read inside a string,
// they end where a character ends.
func (v *Vocab) plainChars() []uint64 {
	v.plain.once.Do(func() {
		v.plain.set = make([]uint64, v.words)
		for id, p := range v.pieces {
			if len(p) > 0 && utf8.Valid(p) && bytes.IndexFunc(p, func(r rune) bool { return r < 0x20 || r == '"' || r == '\\' }) < 0 {
				v.plain.set[id>>6] |= 1 << (id & 63)
			}
		}
	})
	return v.plain.set
}

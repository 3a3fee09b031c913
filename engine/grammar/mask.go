package grammar

// FillMask sets bit id of mask (mask[id/64] & (1 << (id%64))) for every
// token that may come next, and clears the others. mask must hold at least
// Vocab().MaskWords() words. EOS tokens are set only when the document
// may end here. After Dead, no bit is set. Test a bit with
// [github.com/mlxserving/mlxserving/engine.MaskAllows].
func (m *Matcher) FillMask(mask []uint64) { m.fillMask(mask, true) }

// fillMask is FillMask; without fast, by the trie walk without the root
// string, pattern and digit shortcuts: the reference those shortcuts
// must equal.
func (m *Matcher) fillMask(mask []uint64, fast bool) {
	v := m.g.v
	mask = mask[:v.words]
	clear(mask)
	if len(m.states) == 0 {
		return
	}
	m.w.pooled = true
	m.w.resetArena()
	m.setClosing()
	defer func() { m.w.pooled = false }()
	s := m.states[0]
	switch {
	case !fast:
		m.walk(&v.all, 0, m.states, 0, mask, false)
	case len(m.states) == 1 && plainStringBody(&s.f):
		m.stringMask(v.root, s, mask, v.insideLE)
	case len(m.states) == 1 && s.f.kind == fString && s.f.st == sBody && s.f.u8need == 0 && m.patternMask(s, mask):
	default:
		m.walk(&v.all, 0, m.states, 0, mask, m.digitMask(mask))
	}
	if m.CanEnd() {
		for _, e := range v.eos {
			mask[e>>6] |= 1 << (e & 63)
		}
	}
}

func plainStringBody(f *frame) bool {
	return f.kind == fString && f.st == sBody && f.u8need == 0 && f.re == nil
}

// walk visits the trie below node with the stacks that read its path,
// setting the tokens whose bytes all keep some stack alive. With digits,
// node's path is digits only and the tokens made of digits alone are set
// already (digitMask): the walk leaves them out.
func (m *Matcher) walk(t *trie, node int32, states []*stk, depth int, mask []uint64, digits bool) {
	if depth == len(m.bufs) {
		m.bufs = append(m.bufs, make([]*stk, 0, 8))
	}
	for e := t.edgeStart[node]; e < t.edgeStart[node+1]; e++ {
		c := t.edgeByte[e]
		child := t.edgeNode[e]
		onDigits := digits && isDigit(c)
		if onDigits && !m.g.v.digs.mixed[child] {
			continue
		}
		next := m.bufs[depth][:0]
		for _, s := range states {
			next = m.w.adv(s, c, next)
		}
		m.bufs[depth] = next
		if len(next) == 0 {
			continue
		}
		if len(next) > maxStacks {
			next = next[:maxStacks]
		}
		if !onDigits {
			for k := t.tokStart[child]; k < t.tokStart[child+1]; k++ {
				id := t.toks[k]
				mask[id>>6] |= 1 << (id & 63)
			}
		}
		if t.edgeStart[child] == t.edgeStart[child+1] {
			continue
		}
		if len(next) == 1 && plainStringBody(&next[0].f) {
			// A string opened inside the token: classify the rest.
			m.stringMask(m.g.v.info(child, depth+1), next[0], mask, nil)
			continue
		}
		m.walk(t, child, next, depth+1, mask, onDigits)
	}
}

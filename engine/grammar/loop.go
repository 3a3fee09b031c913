package grammar

import "unicode/utf8"

// Inside a plain string the mask depends only on which of a few
// thresholds the string's remaining room reaches: an inside token is
// allowed when its characters fit the room, a closing token when the
// characters before its quote do. Between two thresholds the mask stays
// the same while ordinary characters are read, so a sampler may decode
// several tokens ahead under one mask (engine.StepInput.Loop).

// loopTarget is the number of steps Loop aims for when it picks which
// tokens make up a loop: longer tokens join the loop while the room left
// still gives this many steps.
const loopTarget = 8

// loopSet is a vocabulary's precomputation for Loop.
type loopSet struct {
	// lower[r] is the largest threshold at most r: the smallest room with
	// the same mask as r. Rooms past the end share the last entry.
	lower []int32
	// minClose is the fewest characters a closing token puts before its
	// quote.
	minClose int32
	// caps[i] lists the ordinary tokens needing at most caps[i]
	// characters in masks[i]; caps ascend (1, 2, 4, ..., the longest).
	caps  []int32
	masks [][]uint64
}

// ordinary reports whether token bytes p, read inside a plain string,
// are whole characters needing no escape; it returns their count.
func ordinary(p []byte) (int, bool) {
	if len(p) == 0 || !utf8.Valid(p) {
		return 0, false
	}
	for _, c := range p {
		if c < 0x20 || c == '"' || c == '\\' {
			return 0, false
		}
	}
	return utf8.RuneCount(p), true
}

func (v *Vocab) loopSet() *loopSet {
	v.loops.once.Do(func() { v.loops.set = buildLoopSet(v) })
	return v.loops.set
}

func buildLoopSet(v *Vocab) *loopSet {
	ls := &loopSet{minClose: -1}
	maxT := int32(len(v.insideLE) - 1)
	for _, c := range v.root.closeChars {
		maxT = max(maxT, c)
		if ls.minClose < 0 || c < ls.minClose {
			ls.minClose = c
		}
	}
	is := make([]bool, max(maxT, 0)+1)
	// Inside thresholds: where insideLE grows.
	for r := 1; r < len(v.insideLE); r++ {
		for i, w := range v.insideLE[r] {
			if w != v.insideLE[r-1][i] {
				is[r] = true
				break
			}
		}
	}
	for _, c := range v.root.closeChars {
		is[c] = true
	}
	ls.lower = make([]int32, len(is))
	for r := range is {
		if is[r] || r == 0 {
			ls.lower[r] = int32(r)
		} else {
			ls.lower[r] = ls.lower[r-1]
		}
	}
	need := make([]int32, v.size)
	longest := int32(0)
	for _, id := range v.all.toks {
		if n, ok := ordinary(v.pieces[id]); ok {
			need[id] = int32(n)
			longest = max(longest, int32(n))
		}
	}
	for c := int32(1); longest > 0; c *= 2 {
		c = min(c, longest)
		m := make([]uint64, v.words)
		for id, n := range need {
			if n > 0 && n <= c {
				m[id>>6] |= 1 << (id & 63)
			}
		}
		ls.caps = append(ls.caps, c)
		ls.masks = append(ls.masks, m)
		if c == longest {
			break
		}
	}
	return ls
}

// Loop reports a loop of the matcher's state: a set of tokens after any
// of which FillMask gives the same mask as now, so that a sampler may
// decode up to steps tokens ahead under the current mask while each one
// it samples is in the set. It fills loop (at least Vocab().MaskWords()
// words) with the set and returns steps; 0 (loop cleared) means no loop.
//
// A loop exists inside a string without a pattern, read by one stack:
// the set holds tokens of whole characters that need no escape, as long
// as the string's room (maxLength or Limits.MaxStringLength, and the
// document's Limits.MaxFreeTokens for free-form values) keeps the mask
// unchanged for steps of them. Every token of the set is allowed now.
func (m *Matcher) Loop(loop []uint64) (steps int) {
	v := m.g.v
	loop = loop[:v.words]
	defer func() {
		if steps == 0 {
			clear(loop) // a loop found is copied whole below
		}
	}()
	if len(m.states) != 1 || !plainStringBody(&m.states[0].f) {
		return 0
	}
	ls := v.loopSet()
	if len(ls.caps) == 0 {
		return 0
	}
	m.setClosing()
	f := &m.states[0].f
	r := m.w.room(f)
	// Closing tokens need at least minLength - i characters: that bound
	// moves with every token unless no closer is below it.
	if r <= 0 || (ls.minClose >= 0 && int32(f.n.minLen)-f.i > ls.minClose) {
		return 0
	}
	lo := ls.lower[min(int(r), len(ls.lower)-1)]
	budget := r - lo
	if budget <= 0 {
		return 0
	}
	k := 0
	for k+1 < len(ls.caps) && budget/ls.caps[k+1] >= loopTarget {
		k++
	}
	steps = int(budget / ls.caps[k])
	if freeForm(m.states[0]) {
		// Accept counts each token; the mask changes when the count
		// reaches the budget and the string may only close.
		steps = min(steps, m.g.lim.MaxFreeTokens-m.free-1)
	}
	if steps <= 0 {
		return 0
	}
	copy(loop, ls.masks[k])
	return steps
}

package grammar

import (
	"math"
	"math/bits"
	"strconv"
	"strings"
	"sync"
)

// Numbers. Most of the tokens a vocabulary has for numbers are runs of
// ASCII digits (Llama 3 has 1,110 of one to three digits), and at a
// number position the trie walk read them all digit by digit. Which of
// them may come next depends only on the number read so far: how many
// digits its part still takes (Limits.MaxIntDigits, MaxFracDigits, two
// exponent digits) and, for a number with bounds, its value. The
// vocabulary lists those tokens by length, so a mask takes the ones that
// fit from the lists and walks the trie for the other tokens only; a
// number with bounds whose completions are not all within them (the
// first digits of an integer in 1..100) looks its tokens up in a cache
// of the grammar, filled by the walk.

// digitToks lists the tokens of a vocabulary that are ASCII digits only.
type digitToks struct {
	// nz and z hold those that start with 1-9 and with 0, shortest
	// first; nzLE[l] and zLE[l] count those of at most l digits.
	nz, z     []int32
	nzLE, zLE []int
	// mixed holds the trie nodes on a path of digits from the root below
	// which some token is not digits only: the walk visits those alone.
	mixed map[int32]bool
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// buildDigitToks lists the digit tokens of t, whose token ids index
// pieces.
func buildDigitToks(t *trie, pieces [][]byte) digitToks {
	d := digitToks{mixed: map[int32]bool{}}
	var nz, z [][]int32 // by length
	var visit func(node int32, depth int) bool
	visit = func(node int32, depth int) bool {
		mixed := false
		for e := t.edgeStart[node]; e < t.edgeStart[node+1]; e++ {
			if !isDigit(t.edgeByte[e]) {
				mixed = true
				continue
			}
			child := t.edgeNode[e]
			for k := t.tokStart[child]; k < t.tokStart[child+1]; k++ {
				id := t.toks[k]
				by := &nz
				if pieces[id][0] == '0' {
					by = &z
				}
				for len(*by) <= depth+1 {
					*by = append(*by, nil)
				}
				(*by)[depth+1] = append((*by)[depth+1], id)
			}
			if visit(child, depth+1) {
				d.mixed[child] = true
				mixed = true
			}
		}
		return mixed
	}
	visit(0, 0)
	flat := func(by [][]int32) ([]int32, []int) {
		var ids []int32
		le := make([]int, max(len(by), 2))
		for l := range le {
			if l < len(by) {
				ids = append(ids, by[l]...)
			}
			le[l] = len(ids)
		}
		return ids, le
	}
	d.nz, d.nzLE = flat(nz)
	d.z, d.zLE = flat(z)
	return d
}

// set adds to mask the digit tokens of at most r digits; at the start
// of a number only "0" of those that start with 0.
func (d *digitToks) set(r int, start bool, mask []uint64) {
	if r <= 0 {
		return
	}
	rz := r
	if start {
		rz = 1
	}
	for _, id := range d.nz[:d.nzLE[min(r, len(d.nzLE)-1)]] {
		mask[id>>6] |= 1 << (id & 63)
	}
	for _, id := range d.z[:d.zLE[min(rz, len(d.zLE)-1)]] {
		mask[id>>6] |= 1 << (id & 63)
	}
}

// digitMask adds to mask the digit tokens that the matcher's states
// allow and reports true, or reports false, adding nothing, when some
// state needs the trie walk for them (a string, a key or a literal that
// a digit may continue).
func (m *Matcher) digitMask(mask []uint64) bool {
	nums := m.numBuf[:0]
	for _, s := range m.states {
		var ok bool
		if nums, ok = m.digitNumbers(s, nums); !ok {
			return false
		}
	}
	m.numBuf = nums
	// The walk keeps at most maxStacks readings; past that it would
	// drop some that these lists count.
	if len(nums) > maxStacks {
		return false
	}
	for i := range nums {
		m.numberDigits(&nums[i], mask)
	}
	return true
}

// digitNumbers appends the number frames that a digit read from s would
// continue or start; ok is false when a digit may do something else.
func (m *Matcher) digitNumbers(s *stk, nums []frame) ([]frame, bool) {
	f := &s.f
	switch f.kind {
	case fNumber:
		return append(nums, *f), true
	case fValue:
		return numberStarts(f.n, nums)
	case fArray:
		if f.st == aOpen && m.w.arrMore(f) {
			return numberStarts(f.n.items, nums)
		}
		return nums, true
	case fObject:
		return nums, f.st != oKey || !isDigit(f.lit[f.i])
	case fLit:
		return nums, !isDigit(f.lit[f.i])
	case fRoot:
		return nums, true
	}
	return nums, false
}

// numberStarts appends the numbers a value of n begins with a digit.
func numberStarts(n *node, nums []frame) ([]frame, bool) {
	switch n.kind {
	case kNumber, kInteger:
		return append(nums, frame{kind: fNumber, n: n}), true
	case kAny:
		return append(nums, frame{kind: fNumber, n: anyNumber}), true
	case kUnion:
		for _, a := range n.alts {
			var ok bool
			if nums, ok = numberStarts(a, nums); !ok {
				return nums, false
			}
		}
	case kLiteral:
		for _, l := range n.lits {
			if isDigit(l[0]) {
				return nums, false
			}
		}
	}
	return nums, true
}

// numberDigits adds to mask the digit tokens that number frame f takes.
// A digit the number cannot take ends it, and nothing that holds a
// number takes a digit after it: such tokens are not allowed.
func (m *Matcher) numberDigits(f *frame, mask []uint64) {
	lim := &m.g.lim
	if f.n.bounded() && !m.g.numSettled(f) {
		m.g.nums.digits(m, f, mask)
		return
	}
	d := &m.g.v.digs
	switch f.st {
	case nStart, nSign:
		d.set(lim.MaxIntDigits, true, mask)
	case nInt:
		d.set(lim.MaxIntDigits-int(f.i), false, mask)
	case nDot:
		d.set(lim.MaxFracDigits, false, mask)
	case nFrac:
		d.set(lim.MaxFracDigits-int(f.j), false, mask)
	case nExp, nExpSign:
		d.set(2, false, mask)
	case nExpD:
		d.set(2-int(f.j), false, mask)
	}
}

// numSettled reports whether every completion of the number with
// bounds f lies within them, so that the digits it takes are those of a
// number without bounds. It may say false when unsure.
func (g *Grammar) numSettled(f *frame) bool {
	body := strings.TrimPrefix(f.lit, "-")
	var lo, hi float64 // the magnitudes completions reach
	switch f.st {
	case nZero:
		lo, hi = 0, 1
	case nInt, nDot, nFrac:
		v, err := strconv.ParseFloat(strings.TrimSuffix(body, "."), 64)
		if err != nil {
			return false
		}
		// More digits only add to the magnitude, so it stays at least v
		// (ParseFloat rounds monotonically); it stays below the next
		// value of the last digit read, scaled by the integer digits
		// still allowed.
		lo = v
		if f.st == nInt {
			hi = (v + 1) * math.Pow10(g.lim.MaxIntDigits-int(f.i))
		} else {
			hi = v + math.Pow10(-int(f.j))
		}
		hi *= 1 + 1e-9 // rounding
	default:
		return false
	}
	if len(body) < len(f.lit) {
		lo, hi = -hi, -lo
	}
	n := f.n
	if n.hasMin && (lo < n.min || n.exMin && lo <= n.min) {
		return false
	}
	return !n.hasMax || hi < n.max || !n.exMax && hi == n.max
}

// numKey is the state of a number with bounds, as far as the digits it
// takes go.
type numKey struct {
	n    *node
	st   uint8
	i, j int32
	lit  string
}

// numCache holds, for the states of the grammar's numbers with bounds
// met so far, the digit tokens each takes: a bit per token of the
// vocabulary's digitToks, nz then z.
type numCache struct {
	mu sync.Mutex
	m  map[numKey][]uint64
}

// maxNumStates caps the number states a grammar caches (about 200 bytes
// each on Llama 3: 200 KB at most); past it the walk reads their digits.
// Only states whose completions straddle a bound are cached: an integer
// in 1..100 has about 110, a number with a minimum a dozen.
const maxNumStates = 1024

// get returns the digit tokens number frame f takes, as bits over
// digitToks, from the cache or, on first use, by walking the digit paths
// of the trie.
func (c *numCache) get(m *Matcher, f *frame) []uint64 {
	key := numKey{n: f.n, st: f.st, i: f.i, j: f.j, lit: f.lit}
	c.mu.Lock()
	set, ok := c.m[key]
	c.mu.Unlock()
	if ok {
		return set
	}
	set = m.walkNumberDigits(f)
	c.mu.Lock()
	if c.m == nil {
		c.m = map[numKey][]uint64{}
	}
	if len(c.m) < maxNumStates {
		c.m[key] = set
	}
	c.mu.Unlock()
	return set
}

// digits adds to mask the digit tokens number frame f takes.
func (c *numCache) digits(m *Matcher, f *frame, mask []uint64) {
	d := &m.g.v.digs
	for w, x := range c.get(m, f) {
		for ; x != 0; x &= x - 1 {
			k := w<<6 | bits.TrailingZeros64(x)
			var id int32
			if k < len(d.nz) {
				id = d.nz[k]
			} else {
				id = d.z[k-len(d.nz)]
			}
			mask[id>>6] |= 1 << (id & 63)
		}
	}
}

// warmNumbers caches the digit tokens that start each number with
// bounds of the grammar, and those after a minus sign: the walk for the
// first costs about 0.2 ms on Llama 3, which the first document would
// otherwise pay at its first number.
func (g *Grammar) warmNumbers() {
	m := g.NewMatcher()
	m.w.pooled = true
	eachNode(g.root, func(n *node) {
		if (n.kind == kNumber || n.kind == kInteger) && n.bounded() {
			m.w.resetArena()
			g.nums.get(m, &frame{kind: fNumber, n: n})
			g.nums.get(m, &frame{kind: fNumber, n: n, st: nSign, lit: "-"})
		}
	})
}

// walkNumberDigits reads every digit token from number frame f, with the
// walker's byte steps, and returns those that keep it alive as bits
// over digitToks.
func (m *Matcher) walkNumberDigits(f *frame) []uint64 {
	v := m.g.v
	d := &v.digs
	root := &stk{f: frame{kind: fRoot}}
	s := m.w.mk(*f, root)
	scratch := make([]uint64, v.words)
	var visit func(node int32, states []*stk)
	t := &v.all
	visit = func(node int32, states []*stk) {
		for e := t.edgeStart[node]; e < t.edgeStart[node+1]; e++ {
			c := t.edgeByte[e]
			if !isDigit(c) {
				continue
			}
			var next []*stk
			for _, s := range states {
				next = m.w.adv(s, c, next)
			}
			if len(next) == 0 {
				continue
			}
			child := t.edgeNode[e]
			for k := t.tokStart[child]; k < t.tokStart[child+1]; k++ {
				id := t.toks[k]
				scratch[id>>6] |= 1 << (id & 63)
			}
			visit(child, next)
		}
	}
	visit(0, []*stk{s})
	set := make([]uint64, (len(d.nz)+len(d.z)+63)/64)
	for k, id := range append(d.nz[:len(d.nz):len(d.nz)], d.z...) {
		if scratch[id>>6]&(1<<(id&63)) != 0 {
			set[k>>6] |= 1 << (k & 63)
		}
	}
	return set
}

package grammar

import (
	"math"
	"math/bits"
	"slices"
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
	// bit numbers those tokens, nz then z, for the sets of numCache.
	bit map[int32]int
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
	d.bit = map[int32]int{}
	for k, id := range slices.Concat(d.nz, d.z) {
		d.bit[id] = k
	}
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
			m.numBuf = nums // keep what it grew to: this runs every mask
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
	if f.n.bounded() && !m.g.numSettled(f) {
		m.g.nums.digits(m, f, mask)
		return
	}
	r, start := m.g.lim.digitRoom(f)
	m.g.v.digs.set(r, start, mask)
}

// digitRoom returns how many more digits the part of the number that f
// is reading takes, and whether the number has no digit yet (a leading 0
// then ends its integer part).
func (lim *Limits) digitRoom(f *frame) (r int, start bool) {
	switch f.st {
	case nStart, nSign:
		return lim.MaxIntDigits, true
	case nInt:
		return lim.MaxIntDigits - int(f.i), false
	case nDot:
		return lim.MaxFracDigits, false
	case nFrac:
		return lim.MaxFracDigits - int(f.j), false
	case nExp, nExpSign:
		return 2, false
	case nExpD:
		return 2 - int(f.j), false
	}
	return 0, false
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
	return inBounds(f.n, lo) && inBounds(f.n, hi)
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
	m := g.NewMatcher() // stacks on the heap: no arena for a few walks
	eachNode(g.root, func(n *node) {
		if (n.kind == kNumber || n.kind == kInteger) && n.bounded() {
			g.nums.get(m, &frame{kind: fNumber, n: n})
			g.nums.get(m, &frame{kind: fNumber, n: n, st: nSign, lit: "-"})
		}
	})
}

// walkNumberDigits reads every digit token from number frame f, with the
// walker's byte steps, and returns those that keep it alive as bits
// over digitToks. Below a digit after which the number is settled, the
// tokens are taken by length instead.
func (m *Matcher) walkNumberDigits(f *frame) []uint64 {
	v := m.g.v
	d := &v.digs
	t := &v.all
	set := make([]uint64, (len(d.nz)+len(d.z)+63)/64)
	setNode := func(n int32) {
		for k := t.tokStart[n]; k < t.tokStart[n+1]; k++ {
			b := d.bit[t.toks[k]]
			set[b>>6] |= 1 << (b & 63)
		}
	}
	// below sets the digit tokens under node with at most r more digits.
	var below func(node int32, r int)
	below = func(node int32, r int) {
		for e := t.edgeStart[node]; r > 0 && e < t.edgeStart[node+1]; e++ {
			if isDigit(t.edgeByte[e]) {
				setNode(t.edgeNode[e])
				below(t.edgeNode[e], r-1)
			}
		}
	}
	var visit func(node int32, s *stk)
	visit = func(node int32, s *stk) {
		for e := t.edgeStart[node]; e < t.edgeStart[node+1]; e++ {
			c := t.edgeByte[e]
			if !isDigit(c) {
				continue
			}
			next := m.w.adv(s, c, nil)
			if len(next) == 0 {
				continue
			}
			child := t.edgeNode[e]
			setNode(child)
			if nf := &next[0].f; nf.kind == fNumber && m.g.numSettled(nf) {
				r, _ := m.g.lim.digitRoom(nf)
				below(child, r)
				continue
			}
			visit(child, next[0])
		}
	}
	visit(0, m.w.mk(*f, &stk{f: frame{kind: fRoot}}))
	return set
}

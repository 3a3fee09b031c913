package grammar

import (
	"math"
	"strconv"
	"strings"
)

// advNumber feeds c to a number frame. A byte that cannot continue the
// number ends it (when it may end) and goes to the frame below.
func (w *walker) advNumber(s *stk, c byte, out []*stk) []*stk {
	f := &s.f
	integer := f.n.kind == kInteger
	digit := c >= '0' && c <= '9'
	nf := *f
	switch f.st {
	case nStart:
		switch {
		case c == '-':
			nf.st = nSign
		case c == '0':
			nf.st = nZero
		case digit:
			nf.st, nf.i = nInt, 1
		default:
			return out
		}
	case nSign:
		switch {
		case c == '0':
			nf.st = nZero
		case digit:
			nf.st, nf.i = nInt, 1
		default:
			return out
		}
	case nZero, nInt:
		switch {
		case digit && f.st == nInt && int(f.i) < w.g.lim.MaxIntDigits:
			nf.i++
		case c == '.' && !integer:
			nf.st = nDot
		case (c == 'e' || c == 'E') && !integer && !f.n.bounded():
			nf.st = nExp
		default:
			return w.endNumber(s, c, out)
		}
	case nDot:
		if !digit {
			return out
		}
		nf.st, nf.j = nFrac, 1
	case nFrac:
		switch {
		case digit && int(f.j) < w.g.lim.MaxFracDigits:
			nf.j++
		case c == 'e' || c == 'E':
			if f.n.bounded() {
				return w.endNumber(s, c, out)
			}
			nf.st = nExp
		default:
			return w.endNumber(s, c, out)
		}
	case nExp:
		switch {
		case c == '+' || c == '-':
			nf.st = nExpSign
		case digit:
			nf.st, nf.j = nExpD, 1
		default:
			return out
		}
	case nExpSign:
		if !digit {
			return out
		}
		nf.st, nf.j = nExpD, 1
	case nExpD:
		if digit && f.j < 2 {
			nf.j++
		} else {
			return w.endNumber(s, c, out)
		}
	}
	if f.n.bounded() {
		nf.lit = f.lit + string(c)
		if !w.numFeasible(&nf) {
			return out
		}
	}
	return append(out, w.mk(nf, s.up))
}

// endNumber ends the number on top of s, if complete, and feeds c to
// what holds it. A mask walk ends the same number at every byte that
// cannot continue it, so the last one ended is kept (stacks are
// immutable: the popped stack serves every byte), unless it came from
// the arena and the walker now builds stacks that outlive it.
func (w *walker) endNumber(s *stk, c byte, out []*stk) []*stk {
	if s != w.ended || w.endedPooled && !w.pooled {
		w.ended, w.endedUp, w.endedPooled = s, nil, w.pooled
		if numFinal(&s.f) {
			w.endedUp = w.pop(s)
		}
	}
	if w.endedUp == nil {
		return out
	}
	return w.adv(w.endedUp, c, out)
}

// numFinal reports whether the number read so far is complete and within
// its bounds.
func numFinal(f *frame) bool {
	switch f.st {
	case nZero, nInt, nFrac, nExpD:
	default:
		return false
	}
	n := f.n
	if !n.bounded() {
		return true
	}
	v, err := strconv.ParseFloat(f.lit, 64)
	if err != nil {
		return false
	}
	return inBounds(n, v)
}

func inBounds(n *node, v float64) bool {
	if n.hasMin && (v < n.min || n.exMin && v == n.min) {
		return false
	}
	if n.hasMax && (v > n.max || n.exMax && v == n.max) {
		return false
	}
	return true
}

// numFeasible reports whether some completion of the bounded number
// prefix in f lies within its bounds. The values reachable from a prefix
// are a few intervals: more integer digits scale it by powers of ten,
// more fraction digits stay within one unit of the last digit.
func (w *walker) numFeasible(f *frame) bool {
	n := f.n
	neg := strings.HasPrefix(f.lit, "-")
	body := strings.TrimPrefix(f.lit, "-")
	lo, hi := math.Inf(-1), math.Inf(1)
	if n.hasMin {
		lo = n.min
	}
	if n.hasMax {
		hi = n.max
	}
	if n.kind == kInteger {
		if n.exMin {
			lo = math.Floor(lo) + 1
		}
		if n.exMax {
			hi = math.Ceil(hi) - 1
		}
	}
	eps := math.Pow10(-w.g.lim.MaxFracDigits)
	// fits reports whether a reachable value with magnitude in [a, b]
	// lies within the bounds.
	fits := func(a, b float64) bool {
		if neg {
			a, b = -b, -a
		}
		if n.kind == kInteger {
			return math.Ceil(math.Max(a, lo)) <= math.Floor(math.Min(b, hi))
		}
		if n.exMin && b <= lo || b < lo || n.exMax && a >= hi || a > hi {
			return false
		}
		return math.Max(a, lo) <= math.Min(b, hi)
	}
	maxInt := w.g.lim.MaxIntDigits
	unit := 1 - eps
	if n.kind == kInteger {
		unit = 0
	}
	switch f.st {
	case nSign:
		return fits(0, math.Pow10(maxInt)-1)
	case nZero:
		if n.kind == kInteger {
			return fits(0, 0)
		}
		return fits(0, 1-eps)
	case nInt:
		v, _ := strconv.ParseFloat(body, 64)
		for k := 0; k <= maxInt-int(f.i); k++ {
			p := math.Pow10(k)
			if fits(v*p, (v+1)*p-1+unit) {
				return true
			}
		}
		return false
	case nDot, nFrac:
		v, _ := strconv.ParseFloat(strings.TrimSuffix(body, "."), 64)
		d := int(f.j)
		if d >= w.g.lim.MaxFracDigits {
			return fits(v, v)
		}
		return fits(v, v+math.Pow10(-d)-eps)
	}
	return true
}

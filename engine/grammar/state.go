package grammar

// The matcher's state is a set of stacks of frames, one stack per way the
// bytes so far can be read (anyOf alternatives and enum values diverge
// until their bytes differ). Stacks are immutable linked lists, so a step
// shares everything below the frame it changes.

type fkind uint8

const (
	fRoot   fkind = iota // the document is complete
	fValue               // a value of n comes next, after free whitespace
	fObject              // inside {...}
	fArray               // inside [...]
	fString              // inside "..."
	fNumber              // inside a number
	fLit                 // matching the fixed bytes lit
)

// object sub-states
const (
	oOpen  uint8 = iota // after '{'
	oKey                // matching declared key lit[pos:] (j is its index)
	oColon              // after a key
	oAfter              // after a value
	oComma              // after ','
)

// array sub-states
const (
	aOpen  uint8 = iota // after '['
	aAfter              // after an item
)

// string sub-states
const (
	sBody uint8 = iota
	sEsc        // after '\'
	sHex        // inside \uXXXX; j hex digits left
)

// number sub-states
const (
	nStart uint8 = iota
	nSign
	nZero
	nInt
	nDot
	nFrac
	nExp
	nExpSign
	nExpD
)

type frame struct {
	n     *node
	lit   string  // fLit: the literal; oKey: the key; bounded fNumber: its text
	re    *dstate // fString with a pattern: the DFA state
	kind  fkind
	st    uint8
	ws    uint8 // free whitespace bytes in the current run
	depth uint8
	// u8 tracks an unfinished UTF-8 character in a string: need bytes
	// still to come, the range the next one must fall in, and the bytes
	// so far (for patterns).
	u8need   uint8
	u8lo     uint8
	u8hi     uint8
	u8n      uint8
	u8buf    [4]byte
	surr     bool  // \u escape started with d/D
	i        int32 // object: next declared property / free keys so far; array: items; string: characters; fLit/oKey: position; number: integer digits
	j        int32 // object: property being read; string: max characters or hex digits left; number: fraction or exponent digits
	vals     int32 // values begun so far in the document
	maxChars int32 // string: most characters allowed
}

type stk struct {
	f  frame
	up *stk
}

func isWS(c byte) bool { return c == ' ' || c == '\n' || c == '\t' || c == '\r' }

// Synthetic nodes for free-form values.
var (
	anyNode    = &node{kind: kAny}
	anyObject  = &node{kind: kObject, free: true, extra: anyNode, maxProps: -1}
	anyArray   = &node{kind: kArray, items: anyNode, maxItems: -1}
	freeString = &node{kind: kString, maxLen: -1}
	anyNumber  = &node{kind: kNumber}
	trueLit    = "true"
	falseLit   = "false"
	nullLit    = "null"
)

// walker advances stacks. It allocates stack nodes from an arena while
// computing a mask (they die when the mask is done) and from the heap
// while accepting tokens.
type walker struct {
	g      *Grammar
	arena  [][]stk
	chunk  int
	pos    int
	pooled bool
	// closing is set once the document spent Limits.MaxFreeTokens in
	// free-form values: they only close from then on.
	closing bool
	// ended is the number stack endNumber ended last and endedUp what
	// holds it after (nil: the number was not complete), from the arena
	// when endedPooled.
	ended, endedUp *stk
	endedPooled    bool
}

const arenaChunk = 4096

func (w *walker) mk(f frame, up *stk) *stk {
	if !w.pooled {
		return &stk{f: f, up: up}
	}
	if w.pos == arenaChunk {
		w.chunk++
		w.pos = 0
	}
	if w.chunk == len(w.arena) {
		w.arena = append(w.arena, make([]stk, arenaChunk))
	}
	s := &w.arena[w.chunk][w.pos]
	w.pos++
	s.f, s.up = f, up
	return s
}

func (w *walker) resetArena() { w.chunk, w.pos, w.ended, w.endedUp = 0, 0, nil, nil }

// pop ends the top frame, carrying its value count to the parent.
func (w *walker) pop(s *stk) *stk {
	p := s.up
	if p.f.vals == s.f.vals {
		return p
	}
	f := p.f
	f.vals = s.f.vals
	return w.mk(f, p.up)
}

func (w *walker) capped(depth uint8, vals int32) bool {
	return int(depth) >= w.g.lim.MaxDepth || int(vals) >= w.g.lim.MaxValues
}

// adv feeds byte c to stack s, appending every stack that accepts it.
func (w *walker) adv(s *stk, c byte, out []*stk) []*stk {
	f := &s.f
	switch f.kind {
	case fValue:
		if isWS(c) {
			if int(f.ws) >= w.g.lim.MaxWhitespace || w.closing {
				return out
			}
			nf := *f
			nf.ws++
			return append(out, w.mk(nf, s.up))
		}
		return w.start(s.up, f.n, f.depth, f.vals, c, out)
	case fLit:
		if f.lit[f.i] != c {
			return out
		}
		if int(f.i)+1 == len(f.lit) {
			return append(out, w.pop(s))
		}
		nf := *f
		nf.i++
		return append(out, w.mk(nf, s.up))
	case fString:
		return w.advString(s, c, out)
	case fNumber:
		return w.advNumber(s, c, out)
	case fObject:
		return w.advObject(s, c, out)
	case fArray:
		return w.advArray(s, c, out)
	}
	return out
}

// start begins a value of n on top of up with first byte c.
func (w *walker) start(up *stk, n *node, depth uint8, vals int32, c byte, out []*stk) []*stk {
	vals++
	switch n.kind {
	case kUnion:
		for _, a := range n.alts {
			out = w.start(up, a, depth, vals-1, c, out)
		}
		return out
	case kAny:
		switch {
		case c == '{' || c == '[':
			if w.capped(depth, vals) || w.closing {
				return out
			}
			if c == '{' {
				return w.start(up, anyObject, depth, vals-1, c, out)
			}
			return w.start(up, anyArray, depth, vals-1, c, out)
		case c == '"':
			return w.start(up, freeString, depth, vals-1, c, out)
		case c == '-' || (c >= '0' && c <= '9'):
			return w.start(up, anyNumber, depth, vals-1, c, out)
		case c == 't':
			return w.lit(up, trueLit, vals, out)
		case c == 'f':
			return w.lit(up, falseLit, vals, out)
		case c == 'n':
			return w.lit(up, nullLit, vals, out)
		}
		return out
	case kObject:
		if c != '{' {
			return out
		}
		return append(out, w.mk(frame{kind: fObject, n: n, depth: depth + 1, vals: vals}, up))
	case kArray:
		if c != '[' {
			return out
		}
		return append(out, w.mk(frame{kind: fArray, n: n, depth: depth + 1, vals: vals}, up))
	case kString:
		if c != '"' {
			return out
		}
		maxChars := n.maxLen
		if maxChars < 0 {
			maxChars = max(w.g.lim.MaxStringLength, n.minLen)
			if n.re != nil && n.re.maxLen >= 0 {
				maxChars = max(maxChars, n.re.maxLen)
			}
		}
		if n.re != nil && int(n.re.start.dist) > maxChars {
			return out
		}
		f := frame{kind: fString, n: n, depth: depth, vals: vals, maxChars: int32(maxChars)}
		if n.re != nil {
			f.re = n.re.start
		}
		return append(out, w.mk(f, up))
	case kNumber, kInteger:
		s := w.mk(frame{kind: fNumber, n: n, depth: depth, vals: vals}, up)
		return w.advNumber(s, c, out)
	case kBool:
		if c == 't' {
			return w.lit(up, trueLit, vals, out)
		} else if c == 'f' {
			return w.lit(up, falseLit, vals, out)
		}
	case kNull:
		if c == 'n' {
			return w.lit(up, nullLit, vals, out)
		}
	case kLiteral:
		for _, l := range n.lits {
			if l[0] == c {
				out = w.lit(up, l, vals, out)
			}
		}
	}
	return out
}

// lit starts literal l whose first byte was just read.
func (w *walker) lit(up *stk, l string, vals int32, out []*stk) []*stk {
	if len(l) == 1 {
		f := up.f
		f.vals = vals
		return append(out, w.mk(f, up.up))
	}
	return append(out, w.mk(frame{kind: fLit, lit: l, i: 1, vals: vals}, up))
}

// ws consumes a whitespace byte in a container frame.
func (w *walker) ws(s *stk, out []*stk) []*stk {
	if int(s.f.ws) >= w.g.lim.MaxWhitespace || w.closing {
		return out
	}
	nf := s.f
	nf.ws++
	return append(out, w.mk(nf, s.up))
}

// room is the characters string frame f may still take: none for a
// free-form string once the document is closing.
func (w *walker) room(f *frame) int32 {
	if w.closing && f.n == freeString {
		return 0
	}
	return f.maxChars - f.i
}

// freeForm reports whether the top frame of s, or one below it, is a
// free-form value (see Limits.MaxFreeTokens).
func freeForm(s *stk) bool {
	for ; s != nil; s = s.up {
		if n := s.f.n; n != nil && (n.kind == kAny || n.free || n == freeString || n == anyNumber || (n.kind == kArray && n.items.kind == kAny)) {
			return true
		}
	}
	return false
}

// canEnd reports whether the document may end here.
func canEnd(s *stk) bool {
	for {
		switch s.f.kind {
		case fRoot:
			return true
		case fNumber:
			if !numFinal(&s.f) {
				return false
			}
			s = s.up
		default:
			return false
		}
	}
}

package grammar

import (
	"errors"
	"regexp/syntax"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// regex is a pattern run as a lazily built DFA over runes, from Go's
// regexp/syntax program. JSON schema patterns are unanchored: a value
// matches when the pattern matches anywhere in it, so the program is
// wrapped in (?s:.*) on both sides.
type regex struct {
	prog  *syntax.Prog
	mu    sync.Mutex
	byKey map[string]*dstate
	start *dstate
	live  []bool
	dist  []int32 // per instruction: fewest runes to a match
	// maxLen is the most runes a matching string has, -1 when unbounded.
	maxLen int
	// split is zero for one pattern; for the intersection of two (see
	// compileIntersect) the instructions from split on are the second's,
	// and a string matches when both programs match it.
	split uint32
	// pats caches, per DFA state, the tokens it allows (patmask.go);
	// Vocab.warmRegex fills it ahead of use, over one or more compiles.
	pats patCache
	// warmed is set once every state warmRegex visits has its tokens.
	warmed atomic.Bool
}

// dstate is a DFA state: the set of program counters waiting on a rune.
type dstate struct {
	pcs   []uint32
	match bool  // the text so far matches
	dist  int32 // fewest more runes to a match
	dead  bool  // intersections: no continuation matches both patterns
	next  map[rune]*dstate
	ascii [128]atomic.Pointer[dstate] // lock-free ASCII transitions; deadState for none
}

// deadState marks a known transition to no state in dstate.ascii.
var deadState = &dstate{}

const maxDFAStates = 4096

func compileRegex(pattern string) (*regex, error) {
	re, err := syntax.Parse(`(?s:.*?)(?:`+pattern+`)(?s:.*)`, syntax.Perl)
	if err != nil {
		return nil, err
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return nil, err
	}
	for _, in := range prog.Inst {
		if in.Op == syntax.InstEmptyWidth && syntax.EmptyOp(in.Arg)&^(syntax.EmptyBeginText|syntax.EmptyEndText|syntax.EmptyBeginLine|syntax.EmptyEndLine) != 0 {
			return nil, errors.New("word boundaries are not supported")
		}
	}
	r := &regex{prog: prog, byKey: map[string]*dstate{}, live: liveInsts(prog), dist: distInsts(prog), maxLen: -1}
	if orig, err := syntax.Parse(pattern, syntax.Perl); err == nil {
		r.maxLen = anchoredMaxLen(orig.Simplify())
	}
	r.start = r.state([]uint32{uint32(prog.Start)}, true)
	if !r.alive(r.start) {
		return nil, errors.New("the pattern matches no string")
	}
	return r, nil
}

// liveInsts marks the instructions from which a match is reachable past
// the start of the text. Rune instructions are assumed to consume some
// rune, so a live state can always be completed.
func liveInsts(prog *syntax.Prog) []bool {
	live := make([]bool, len(prog.Inst))
	for changed := true; changed; {
		changed = false
		for pc := range prog.Inst {
			if live[pc] {
				continue
			}
			in := &prog.Inst[pc]
			var l bool
			switch in.Op {
			case syntax.InstMatch:
				l = true
			case syntax.InstAlt, syntax.InstAltMatch:
				l = live[in.Out] || live[in.Arg]
			case syntax.InstFail:
			case syntax.InstEmptyWidth:
				l = syntax.EmptyOp(in.Arg)&(syntax.EmptyBeginText|syntax.EmptyBeginLine) == 0 && live[in.Out]
			default:
				l = live[in.Out]
			}
			if l {
				live[pc], changed = true, true
			}
		}
	}
	return live
}

const unreachable = 1 << 30

// distInsts computes, per instruction, the fewest runes to reach a match
// past the start of the text.
func distInsts(prog *syntax.Prog) []int32 {
	dist := make([]int32, len(prog.Inst))
	for i := range dist {
		dist[i] = unreachable
	}
	for changed := true; changed; {
		changed = false
		for pc := range prog.Inst {
			in := &prog.Inst[pc]
			d := int32(unreachable)
			switch in.Op {
			case syntax.InstMatch:
				d = 0
			case syntax.InstAlt, syntax.InstAltMatch:
				d = min(dist[in.Out], dist[in.Arg])
			case syntax.InstFail:
			case syntax.InstCapture, syntax.InstNop:
				d = dist[in.Out]
			case syntax.InstEmptyWidth:
				if syntax.EmptyOp(in.Arg)&(syntax.EmptyBeginText|syntax.EmptyBeginLine) == 0 {
					d = dist[in.Out]
				}
			default:
				d = min(dist[in.Out]+1, unreachable)
			}
			if d < dist[pc] {
				dist[pc], changed = d, true
			}
		}
	}
	return dist
}

// anchoredMaxLen is the longest match of a pattern anchored at both ends,
// or -1 when unanchored or unbounded.
func anchoredMaxLen(re *syntax.Regexp) int {
	if re.Op != syntax.OpConcat || len(re.Sub) < 2 || re.Sub[0].Op != syntax.OpBeginText || re.Sub[len(re.Sub)-1].Op != syntax.OpEndText {
		return -1
	}
	n := maxLenOf(re)
	if n >= unreachable {
		return -1
	}
	return n
}

func maxLenOf(re *syntax.Regexp) int {
	switch re.Op {
	case syntax.OpLiteral:
		return len(re.Rune)
	case syntax.OpCharClass, syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		return 1
	case syntax.OpCapture, syntax.OpQuest:
		return maxLenOf(re.Sub[0])
	case syntax.OpConcat:
		t := 0
		for _, s := range re.Sub {
			t = min(t+maxLenOf(s), unreachable)
		}
		return t
	case syntax.OpAlternate:
		t := 0
		for _, s := range re.Sub {
			t = max(t, maxLenOf(s))
		}
		return t
	case syntax.OpRepeat:
		if re.Max < 0 {
			return unreachable
		}
		return min(re.Max*maxLenOf(re.Sub[0]), unreachable)
	case syntax.OpStar, syntax.OpPlus:
		return unreachable
	}
	return 0
}

// alive reports whether some continuation of s matches. For an
// intersection it is exact once explore has run.
func (r *regex) alive(s *dstate) bool {
	if s.match {
		return true
	}
	if s.dead {
		return false
	}
	var liveA, liveB bool
	for _, pc := range s.pcs {
		if r.live[pc] {
			if r.split > 0 && pc >= r.split {
				liveB = true
			} else {
				liveA = true
			}
		}
	}
	return liveA && (r.split == 0 || liveB)
}

// closure follows empty transitions from pcs, returning the rune-consuming
// instructions reached and whether a match is reachable at end of text.
func (r *regex) closure(pcs []uint32, begin bool) ([]uint32, bool) {
	var out []uint32
	var matchA, matchB bool
	seen := make(map[uint32]bool)
	var visit func(pc uint32, end bool)
	visit = func(pc uint32, end bool) {
		key := pc<<1 | b2u(end)
		if seen[key] {
			return
		}
		seen[key] = true
		in := &r.prog.Inst[pc]
		switch in.Op {
		case syntax.InstAlt, syntax.InstAltMatch:
			visit(in.Out, end)
			visit(in.Arg, end)
		case syntax.InstCapture, syntax.InstNop:
			visit(in.Out, end)
		case syntax.InstEmptyWidth:
			op := syntax.EmptyOp(in.Arg)
			if op&(syntax.EmptyBeginText|syntax.EmptyBeginLine) != 0 && !begin {
				return
			}
			if op&(syntax.EmptyEndText|syntax.EmptyEndLine) != 0 {
				visit(in.Out, true)
				return
			}
			visit(in.Out, end)
		case syntax.InstMatch:
			if r.split > 0 && pc >= r.split {
				matchB = true
			} else {
				matchA = true
			}
		case syntax.InstFail:
		default:
			if !end {
				out = append(out, pc)
			}
		}
	}
	for _, pc := range pcs {
		visit(pc, false)
	}
	slices.Sort(out)
	return slices.Compact(out), matchA && (r.split == 0 || matchB)
}

func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// state interns the DFA state reached at pcs. Call with r.mu held or
// before r is shared.
func (r *regex) state(pcs []uint32, begin bool) *dstate {
	all, match := r.closure(pcs, begin)
	closed := all[:0]
	for _, pc := range all {
		if r.live == nil || r.live[pc] {
			closed = append(closed, pc)
		}
	}
	var sb strings.Builder
	for _, pc := range closed {
		sb.WriteString(strconv.FormatUint(uint64(pc), 36))
		sb.WriteByte(',')
	}
	if match {
		sb.WriteByte('m')
	}
	key := sb.String()
	if s, ok := r.byKey[key]; ok {
		return s
	}
	s := &dstate{pcs: closed, match: match, next: map[rune]*dstate{}, dist: unreachable}
	if match {
		s.dist = 0
	}
	if r.dist != nil && !match {
		// Fewest runes to a match: per program, then the larger of the
		// two for an intersection (a lower bound; explore makes it exact).
		distA, distB := int32(unreachable), int32(unreachable)
		for _, pc := range closed {
			if r.split > 0 && pc >= r.split {
				distB = min(distB, r.dist[pc])
			} else {
				distA = min(distA, r.dist[pc])
			}
		}
		s.dist = distA
		if r.split > 0 {
			s.dist = max(distA, distB)
		}
	}
	if len(r.byKey) < maxDFAStates {
		r.byKey[key] = s
	}
	return s
}

// step returns the state after rune c, or nil when no match can follow.
func (r *regex) step(s *dstate, c rune) *dstate {
	if c >= 0 && c < 128 {
		if n := s.ascii[c].Load(); n != nil {
			if n == deadState {
				return nil
			}
			return n
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n, ok := s.next[c]; ok {
		return n
	}
	var pcs []uint32
	for _, pc := range s.pcs {
		in := &r.prog.Inst[pc]
		if in.MatchRune(c) {
			pcs = append(pcs, in.Out)
		}
	}
	var n *dstate
	if len(pcs) > 0 {
		n = r.state(pcs, false)
		if !r.alive(n) {
			n = nil
		}
	}
	if c >= 0 && c < 128 {
		if n == nil {
			s.ascii[c].Store(deadState)
		} else {
			s.ascii[c].Store(n)
		}
	} else if len(s.next) < 1024 {
		s.next[c] = n
	}
	return n
}

// decodeRune completes a rune from its UTF-8 bytes.
func decodeRune(b []byte) rune {
	c, _ := utf8.DecodeRune(b)
	return c
}

// accepts reports whether some rune in rr can follow state s, when at
// most room characters are left (the rune included): a partial UTF-8
// character is only started when it can be finished and the pattern
// still matched in time.
func (r *regex) accepts(s *dstate, rr [2]rune, room int32) bool {
	lo, hi := rr[0], rr[1]
	for _, pc := range s.pcs {
		in := &r.prog.Inst[pc]
		ok := false
		switch in.Op {
		case syntax.InstRuneAny:
			ok = true
		case syntax.InstRuneAnyNotNL:
			ok = lo != '\n' || hi != '\n'
		case syntax.InstRune1:
			ok = in.Rune[0] >= lo && in.Rune[0] <= hi
		case syntax.InstRune:
			ok = syntax.Flags(in.Arg)&syntax.FoldCase != 0
			for i := 0; i+1 < len(in.Rune) && !ok; i += 2 {
				ok = in.Rune[i] <= hi && in.Rune[i+1] >= lo
			}
			if len(in.Rune) == 1 {
				ok = in.Rune[0] >= lo && in.Rune[0] <= hi
			}
		}
		if ok && 1+r.dist[in.Out] <= room {
			return true
		}
	}
	return false
}

// partialRange is the range of runes whose UTF-8 encoding starts with
// buf, when the next byte must lie in [next0, next1] and need bytes are
// still to come.
func partialRange(buf []byte, next0, next1 byte, need int) (rune, rune) {
	lo := append([]byte(nil), buf...)
	hi := append([]byte(nil), buf...)
	lo = append(lo, next0)
	hi = append(hi, next1)
	for k := 1; k < need; k++ {
		lo = append(lo, 0x80)
		hi = append(hi, 0xBF)
	}
	return decodeRune(lo), decodeRune(hi)
}

// formats maps the string formats OpenAI's structured outputs accept to
// patterns that generate only valid values.
var formats = map[string]string{
	"date-time": `^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|1\d|2[0-8])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$`,
	"date":      `^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|1\d|2[0-8])$`,
	"time":      `^([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$`,
	// ISO 8601: weeks alone, or days and/or a time part; at least one
	// component, and a T only before one ("P" and "PT" are not durations).
	"duration": `^P(\d{1,4}W|\d{1,4}D(T(\d{1,2}H(\d{1,2}M)?(\d{1,2}S)?|\d{1,2}M(\d{1,2}S)?|\d{1,2}S))?|T(\d{1,2}H(\d{1,2}M)?(\d{1,2}S)?|\d{1,2}M(\d{1,2}S)?|\d{1,2}S))$`,
	"email":    `^[a-zA-Z0-9_%+-]{1,30}(\.[a-zA-Z0-9_%+-]{1,16}){0,2}@[a-zA-Z0-9]([a-zA-Z0-9-]{0,30}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,30}[a-zA-Z0-9])?){0,3}\.[a-zA-Z]{2,8}$`,
	"hostname": `^[a-zA-Z0-9]([a-zA-Z0-9-]{0,30}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,30}[a-zA-Z0-9])?){0,4}$`,
	"ipv4":     `^((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$`,
	// Full and compressed forms (RFC 4291 section 2.2), no zone.
	"ipv6": `^(([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,7}:|([0-9a-fA-F]{1,4}:){1,6}:[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,5}(:[0-9a-fA-F]{1,4}){1,2}|([0-9a-fA-F]{1,4}:){1,4}(:[0-9a-fA-F]{1,4}){1,3}|([0-9a-fA-F]{1,4}:){1,3}(:[0-9a-fA-F]{1,4}){1,4}|([0-9a-fA-F]{1,4}:){1,2}(:[0-9a-fA-F]{1,4}){1,5}|[0-9a-fA-F]{1,4}:(:[0-9a-fA-F]{1,4}){1,6}|:((:[0-9a-fA-F]{1,4}){1,7}|:))$`,
	"uuid": `^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`,
}

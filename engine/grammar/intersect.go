package grammar

import (
	"errors"
	"regexp/syntax"
	"slices"
	"unicode"
)

// compileIntersect compiles the strings that match both patterns: the two
// programs run side by side in one DFA whose states hold the instructions
// of both, and a state matches when both programs do. Whether a state can
// still reach a match of both is not a property of either program alone,
// so the whole product DFA is explored here, once: every state that
// cannot complete both is marked dead and every state's distance to a
// match is exact. Products past maxDFAStates are refused.
func compileIntersect(a, b string) (*regex, error) {
	pa, err := wrapProgram(a)
	if err != nil {
		return nil, err
	}
	pb, err := wrapProgram(b)
	if err != nil {
		return nil, err
	}
	off := uint32(len(pa.Inst))
	insts := slices.Clone(pa.Inst)
	for _, in := range pb.Inst {
		in.Out += off
		if in.Op == syntax.InstAlt || in.Op == syntax.InstAltMatch {
			in.Arg += off
		}
		insts = append(insts, in)
	}
	start := len(insts)
	insts = append(insts, syntax.Inst{Op: syntax.InstAlt, Out: uint32(pa.Start), Arg: uint32(pb.Start) + off})
	prog := &syntax.Prog{Inst: insts, Start: start, NumCap: max(pa.NumCap, pb.NumCap)}
	r := &regex{prog: prog, byKey: map[string]*dstate{}, live: liveInsts(prog), dist: distInsts(prog), maxLen: -1, split: off}
	r.maxLen = boundOfBoth(a, b)
	r.start = r.state([]uint32{uint32(start)}, true)
	if err := r.explore(); err != nil {
		return nil, err
	}
	if !r.alive(r.start) {
		return nil, errors.New("no string matches both the pattern and the format")
	}
	return r, nil
}

// wrapProgram compiles a pattern as compileRegex does: unanchored, no word
// boundaries.
func wrapProgram(pattern string) (*syntax.Prog, error) {
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
	return prog, nil
}

// boundOfBoth is the most runes a string matching both anchored patterns
// has: the smaller bound, -1 when neither is bounded.
func boundOfBoth(a, b string) int {
	bound := -1
	for _, p := range []string{a, b} {
		re, err := syntax.Parse(p, syntax.Perl)
		if err != nil {
			continue
		}
		if n := anchoredMaxLen(re.Simplify()); n >= 0 && (bound < 0 || n < bound) {
			bound = n
		}
	}
	return bound
}

var errProductTooLarge = errors.New("the pattern and the format together make too many states")

// explore builds every state reachable from the start, one rune of each
// class the programs tell apart, then sets each state's exact distance to
// a match (backwards from the matching states) and marks the states with
// none dead. The transitions cached while exploring are dropped, so that
// step recomputes them against the exact liveness.
func (r *regex) explore() error {
	reps := r.representatives()
	succ := map[*dstate][]*dstate{}
	queue := []*dstate{r.start}
	succ[r.start] = nil
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		var next []*dstate
		for _, c := range reps {
			var pcs []uint32
			for _, pc := range s.pcs {
				if r.prog.Inst[pc].MatchRune(c) {
					pcs = append(pcs, r.prog.Inst[pc].Out)
				}
			}
			if len(pcs) == 0 {
				continue
			}
			n := r.state(pcs, false)
			next = append(next, n)
			if _, ok := succ[n]; !ok {
				if len(succ) >= maxDFAStates {
					return errProductTooLarge
				}
				succ[n] = nil
				queue = append(queue, n)
			}
		}
		succ[s] = next
	}
	pred := map[*dstate][]*dstate{}
	var frontier []*dstate
	for s, ns := range succ {
		s.dist = unreachable
		if s.match {
			s.dist = 0
			frontier = append(frontier, s)
		}
		for _, n := range ns {
			pred[n] = append(pred[n], s)
		}
	}
	for len(frontier) > 0 {
		n := frontier[0]
		frontier = frontier[1:]
		for _, p := range pred[n] {
			if p.dist > n.dist+1 {
				p.dist = n.dist + 1
				frontier = append(frontier, p)
			}
		}
	}
	for s := range succ {
		s.dead = s.dist >= unreachable
		s.next = map[rune]*dstate{}
		for i := range s.ascii {
			s.ascii[i].Store(nil)
		}
	}
	return nil
}

// representatives returns one rune of every class of runes that the
// programs' instructions cannot tell apart: the start of each range, the
// rune after its end, and their case variants.
func (r *regex) representatives() []rune {
	set := map[rune]bool{0: true}
	add := func(c rune) {
		if c < 0 || c > unicode.MaxRune {
			return
		}
		set[c] = true
		for f := unicode.SimpleFold(c); f != c; f = unicode.SimpleFold(f) {
			set[f] = true
			set[f+1] = true
		}
	}
	for _, in := range r.prog.Inst {
		switch in.Op {
		case syntax.InstRune1:
			add(in.Rune[0])
			add(in.Rune[0] + 1)
		case syntax.InstRune:
			if len(in.Rune) == 1 {
				add(in.Rune[0])
				add(in.Rune[0] + 1)
				continue
			}
			for i := 0; i+1 < len(in.Rune); i += 2 {
				add(in.Rune[i])
				add(in.Rune[i+1])
				add(in.Rune[i+1] + 1)
			}
		case syntax.InstRuneAnyNotNL:
			add('\n')
			add('\n' + 1)
		}
	}
	out := make([]rune, 0, len(set))
	for c := range set {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

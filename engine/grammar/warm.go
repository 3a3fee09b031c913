package grammar

import (
	"time"
	"unicode/utf8"
)

// Warming. The first time a pattern's DFA state is met, the tokens it
// allows are found by a walk of the vocabulary trie (patInfo): 0.1 ms for
// a uuid or date state, up to 20 ms for a state of an email or hostname
// part, which admit most alphanumeric tokens. Compile does those walks
// for every pattern of the schema, so that no generated document pays
// them, within compileWarmBudget: a compile is on a request's path, so
// what the budget leaves is warmed by the next compiles that meet the
// pattern, or built on first use as before. Patterns are compiled once
// per vocabulary (Vocab.regex), so a format shared by many schemas is
// warmed once.

// compileWarmBudget bounds the pattern warming one Compile does. An email
// or hostname format takes 0.5-2 s to warm whole (hundreds of states,
// each a walk of the vocabulary), which would all land on the first
// request's time to first token; a uuid or date-time takes a few
// milliseconds and is warmed whole by its first compile.
const compileWarmBudget = 50 * time.Millisecond

// maxRegexes caps the patterns a vocabulary keeps compiled and warmed;
// the least recently compiled goes first.
const maxRegexes = 256

// maxWarmStates caps the DFA states warmed per pattern, nearest the
// start first: email has 350, hostname 315, uuid and date-time under 40.
const maxWarmStates = maxPatInfos

// regex compiles pattern, or returns the one compiled for the
// vocabulary before.
func (c *compiler) regex(pattern string) (*regex, error) {
	return c.cached("p\x00"+pattern, func() (*regex, error) { return compileRegex(pattern) })
}

// intersect is compileIntersect, cached as regex is.
func (c *compiler) intersect(a, b string) (*regex, error) {
	return c.cached("i\x00"+a+"\x00"+b, func() (*regex, error) { return compileIntersect(a, b) })
}

func (c *compiler) cached(key string, build func() (*regex, error)) (*regex, error) {
	if c.regexes == nil {
		return build()
	}
	if re, ok := c.regexes.Get(key); ok {
		return re, nil
	}
	re, err := build()
	if err == nil {
		c.regexes.Add(key, re)
	}
	return re, err
}

// warm computes the token sets of the DFA states of every pattern under
// root until deadline and, on the vocabulary's first compile, the string
// classes of the tokens that open a string. It reports whether every
// pattern is warm.
func (v *Vocab) warm(root *node, deadline time.Time) bool {
	v.quoteWarm.Do(v.warmQuotes)
	all := true
	eachNode(root, func(n *node) {
		if n.re != nil && !v.warmRegex(n.re, deadline) {
			all = false
		}
	})
	return all
}

// eachNode calls fn once for every node reachable from root.
func eachNode(root *node, fn func(*node)) {
	seen := map[*node]bool{}
	var visit func(n *node)
	visit = func(n *node) {
		if n == nil || seen[n] {
			return
		}
		seen[n] = true
		fn(n)
		for _, p := range n.props {
			visit(p.n)
		}
		visit(n.extra)
		visit(n.items)
		for _, a := range n.alts {
			visit(a)
		}
	}
	visit(root)
}

// warmRegex visits re's states breadth first from the start, one rune of
// each class its program tells apart (those a JSON string holds
// unescaped), and computes each one's patInfo, until deadline; it reports
// whether it got through. States warmed before are cached, so a later
// call goes on where one stopped.
func (v *Vocab) warmRegex(re *regex, deadline time.Time) bool {
	if re.warmed.Load() {
		return true
	}
	var reps []rune
	for _, c := range re.representatives() {
		if c >= 0x20 && c != '"' && c != '\\' && utf8.ValidRune(c) {
			reps = append(reps, c)
		}
	}
	seen := map[*dstate]bool{re.start: true}
	queue := []*dstate{re.start}
	for len(queue) > 0 && len(seen) <= maxWarmStates {
		if !time.Now().Before(deadline) {
			return false // the next compile that meets re goes on
		}
		s := queue[0]
		queue = queue[1:]
		if v.patInfo(re, s) == nil {
			break // the pattern's state cache is full
		}
		for _, c := range reps {
			if n := re.step(s, c); n != nil && !seen[n] {
				seen[n] = true
				queue = append(queue, n)
			}
		}
	}
	re.warmed.Store(true)
	return true
}

// warmQuotes builds the strInfo of every trie node reached by a token
// prefix ending in a quote that more bytes follow (`"`, `{"`, `":"`,
// ...): the walk classifies the rest of such tokens as string bytes when
// the quote opens a string, and would build it on first use.
func (v *Vocab) warmQuotes() {
	t := &v.all
	var visit func(node int32, depth int)
	visit = func(node int32, depth int) {
		for e := t.edgeStart[node]; e < t.edgeStart[node+1]; e++ {
			child := t.edgeNode[e]
			if t.edgeStart[child] == t.edgeStart[child+1] {
				continue
			}
			if t.edgeByte[e] == '"' {
				v.info(child, depth+1)
			}
			visit(child, depth+1)
		}
	}
	visit(0, 0)
}

package grammar

import "unicode/utf8"

// Warming. The first time a pattern's DFA state is met, the tokens it
// allows are found by a walk of the vocabulary trie (patInfo): 0.1 ms for
// a uuid or date state, up to 20 ms for a state of an email or hostname
// part, which admit most alphanumeric tokens. Compile does those walks
// for every pattern of the schema, so that no generated document pays
// them. Patterns are compiled once per vocabulary (Vocab.regex), so a
// format shared by many schemas is warmed once.

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
// root and, on the vocabulary's first compile, the string classes of the
// tokens that open a string.
func (v *Vocab) warm(root *node) {
	v.quoteWarm.Do(v.warmQuotes)
	seen := map[*node]bool{}
	var visit func(n *node)
	visit = func(n *node) {
		if n == nil || seen[n] {
			return
		}
		seen[n] = true
		if n.re != nil {
			v.warmRegex(n.re)
		}
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
// unescaped), and computes each one's patInfo; once per regex.
func (v *Vocab) warmRegex(re *regex) {
	re.warm.Do(func() {
		var reps []rune
		for _, c := range re.representatives() {
			if c >= 0x20 && c != '"' && c != '\\' && utf8.ValidRune(c) {
				reps = append(reps, c)
			}
		}
		seen := map[*dstate]bool{re.start: true}
		queue := []*dstate{re.start}
		for len(queue) > 0 && len(seen) <= maxWarmStates {
			s := queue[0]
			queue = queue[1:]
			if v.patInfo(re, s) == nil {
				return
			}
			for _, c := range reps {
				if n := re.step(s, c); n != nil && !seen[n] {
					seen[n] = true
					queue = append(queue, n)
				}
			}
		}
	})
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

package mlx

// Sliding windows in the KV pool (vLLM's hybrid allocator, SGLang's SWA
// pool). The layers fall in groups of G layers of one kind, full
// attention or sliding window, G the gcd of the two kinds' counts (Gemma
// 3 27B: 10 full and 52 sliding layers, groups of 2), and every group
// draws its rows from the one pool: a block is one token's keys and
// values in one group's G layers. A sequence of n tokens holds n rows in
// every full group; a sliding group keeps only the last windowKeep
// positions after each step and gives the rows before back to the pool,
// so a Gemma 3 sequence at 128k holds about a sixth of a full KV.

// windowSlack is how many positions beyond the window (less one) a
// sliding group keeps: a saved prefix serves a later prompt that shares
// all of it but up to this many of its last tokens (the window of the
// prompt's next token must still be there).
const windowSlack = 32

// kvLayout is how the layers share the pool's blocks. Without sliding
// groups it is one group of every layer (a layer may still attend
// through a window; the pool then keeps every row, as when the window
// frees nothing within the context).
type kvLayout struct {
	groups [][]int // each group's layers: full groups first
	slides []bool  // per group: it keeps only the window's rows
	// hasFull and hasWin say whether a group has full-attention layers
	// and sliding ones (both in the one group of a model without
	// sliding groups).
	hasFull, hasWin []bool
	group, slot     []int // per layer: its group, and its place in it (the pool array it uses)
	window          int   // the sliding layers' window
	keep            int   // positions a sliding group keeps after a step; 0 without sliding groups
	full, sliding   int   // groups of each kind
}

// newKVLayout groups c's layers for a context of ctxLen tokens: sliding
// groups only when the window frees rows within the context.
func newKVLayout(c *modelConfig, ctxLen int) *kvLayout {
	var full, sliding []int
	for li := range c.Layers {
		if c.slides(li) {
			sliding = append(sliding, li)
		} else {
			full = append(full, li)
		}
	}
	l := &kvLayout{window: c.Window}
	if len(sliding) == 0 || 2*(c.Window-1+windowSlack) >= ctxLen {
		all := make([]int, c.Layers)
		for i := range all {
			all[i] = i
		}
		l.groups, l.slides, l.full = [][]int{all}, []bool{false}, 1
		l.hasFull, l.hasWin = []bool{len(full) > 0}, []bool{len(sliding) > 0}
	} else {
		g := gcd(len(full), len(sliding))
		l.addGroups(full, g, false)
		l.addGroups(sliding, g, true)
		l.keep = c.Window - 1 + windowSlack
	}
	l.group, l.slot = make([]int, c.Layers), make([]int, c.Layers)
	for gi, ls := range l.groups {
		for j, li := range ls {
			l.group[li], l.slot[li] = gi, j
		}
	}
	return l
}

// addGroups appends layers in groups of g, all of one kind.
func (l *kvLayout) addGroups(layers []int, g int, slides bool) {
	for i := 0; i < len(layers); i += g {
		l.groups = append(l.groups, layers[i:i+g])
		l.slides = append(l.slides, slides)
		l.hasFull = append(l.hasFull, !slides)
		l.hasWin = append(l.hasWin, slides)
		if slides {
			l.sliding++
		} else {
			l.full++
		}
	}
}

// slots is the number of pool arrays: the layers of one group.
func (l *kvLayout) slots() int { return len(l.groups[0]) }

// windowBlocks is the most rows a live sequence is charged in a sliding
// group (engine.Info.WindowBlocks): the keep of the last step and, while
// a step runs, the new positions it keeps (a step's first queries read
// rows from before it while its last tokens take theirs).
func (l *kvLayout) windowBlocks() int { return 2 * l.keep }

// keeps is how many of a step's t new positions group gi keeps.
func (l *kvLayout) keeps(gi, t int) int {
	if l.slides[gi] {
		return min(t, l.keep)
	}
	return t
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

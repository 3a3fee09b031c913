package mlx

// Sliding windows in the KV pool (as vLLM's hybrid allocator and
// SGLang's SWA pool free them). The layers fall in up to two groups, the
// full-attention layers and the sliding ones, and each group has rows of
// its own: a row holds one token's keys and values in every layer of
// the group, each layer an array of the group's rows. A sequence of n
// tokens holds n rows of the full group; the sliding group keeps only
// its last windowKeep positions after each step and gives the rows
// before back, so a Gemma 3 sequence at 128k holds about a sixth of a
// full KV. Groups do not share arrays: MLX updates a pool array in place
// only when no read of it is pending in the step, and a layer of one
// group reads its array before the next group would write it.

// windowSlack is how many positions beyond the window (less one) a
// sliding group keeps: a saved prefix serves a later prompt that shares
// all of it but up to this many of its last tokens (the window of the
// prompt's next token must still be there).
const windowSlack = 32

// kvLayout is how the layers share the pool's rows. Without a sliding
// group it is one group of every layer (a layer may still attend
// through a window; the pool then keeps every row, as when the window
// frees nothing within the context).
type kvLayout struct {
	groups [][]int // each group's layers: the full group first
	slides []bool  // per group: it keeps only the window's rows
	// hasFull and hasWin say whether a group has full-attention layers
	// and sliding ones (both in the one group of a model without a
	// sliding group).
	hasFull, hasWin []bool
	group           []int // per layer: its group
	window          int   // the sliding layers' window
	keep            int   // positions the sliding group keeps after a step; 0 without one
}

// newKVLayout groups c's layers for a context of ctxLen tokens: a
// sliding group only when the window frees rows within the context.
func newKVLayout(c *modelConfig, ctxLen int) *kvLayout {
	var full, sliding []int
	for li := range c.Layers {
		if c.slides(li) {
			sliding = append(sliding, li)
		} else {
			full = append(full, li)
		}
	}
	l := &kvLayout{window: c.Window, keep: c.Window - 1 + windowSlack}
	if len(sliding) == 0 || l.windowBlocks() >= ctxLen {
		return oneGroup(c)
	}
	if len(full) > 0 {
		l.add(full, false)
	}
	l.add(sliding, true)
	l.place(c.Layers)
	return l
}

// oneGroup is the layout of one group of every layer: the pool keeps
// every row of every layer, sliding or not.
func oneGroup(c *modelConfig) *kvLayout {
	all := make([]int, c.Layers)
	full, win := false, false
	for li := range all {
		all[li] = li
		full, win = full || !c.slides(li), win || c.slides(li)
	}
	l := &kvLayout{groups: [][]int{all}, slides: []bool{false}, hasFull: []bool{full}, hasWin: []bool{win}, window: c.Window}
	l.place(c.Layers)
	return l
}

// add appends a group of layers of one kind.
func (l *kvLayout) add(layers []int, slides bool) {
	l.groups = append(l.groups, layers)
	l.slides = append(l.slides, slides)
	l.hasFull = append(l.hasFull, !slides)
	l.hasWin = append(l.hasWin, slides)
}

// place records each layer's group.
func (l *kvLayout) place(layers int) {
	l.group = make([]int, layers)
	for gi, ls := range l.groups {
		for _, li := range ls {
			l.group[li] = gi
		}
	}
}

// sliding reports whether the last group slides.
func (l *kvLayout) sliding() bool { return l.slides[len(l.slides)-1] }

// windowBlocks is the most rows a live sequence holds in the sliding
// group (engine.Info.WindowBlocks), reached while a prompt chunk of at
// least keep tokens runs: its first queries read the window-1 positions
// before it while its last keep tokens take their rows. A step gives
// back the rows it neither reads nor keeps before it takes new ones
// (kvPool.trim), so a decode step holds no more than keep.
func (l *kvLayout) windowBlocks() int { return l.window - 1 + l.keep }

// keeps is how many of a step's t new positions group gi keeps.
func (l *kvLayout) keeps(gi, t int) int {
	if l.slides[gi] {
		return min(t, l.keep)
	}
	return t
}

// rows is the pool's rows in each group when the first has blocks rows:
// a sliding group after a full one has rows for maxBatch+1 sequences'
// keep, or blocks if fewer. The batcher runs at most maxBatch sequences,
// each holding keep rows between steps; the one more keep is room for a
// prompt chunk's read window (window-1 rows, fewer than keep) while it
// runs, or for scratch sequences.
func (l *kvLayout) rows(blocks, maxBatch int) []int {
	if len(l.groups) == 1 {
		return []int{blocks}
	}
	return []int{blocks, min(blocks, (maxBatch+1)*l.keep)}
}

// bytes is the memory of a pool of rows (per group) whose layers take
// rowBytes a row each.
func (l *kvLayout) bytes(rows []int, rowBytes uint64) uint64 {
	var n uint64
	for gi, r := range rows {
		n += uint64(r*len(l.groups[gi])) * rowBytes
	}
	return n
}

//go:build mlx

package mlx

import (
	"math"
	"slices"
)

// kvPad is the granularity of the gathered KV length in a batched decode
// step, so that its shapes change every kvPad tokens rather than every
// step.
const kvPad = 32

// stepPlan is a step's layout, built on the host once and shared by every
// layer: the pool rows of each packed token, the decode feeds (one token
// each) gathered as one batch, and how attention outputs map back to
// token order. Pool rows are per layer group (kvLayout).
type stepPlan struct {
	n      int   // packed tokens
	writes []arr // per group: [2*n*kvHeads] pool rows of each token's key heads, then of its value heads (kvRows)
	dec    []int
	decQ   arr // [len(dec)] token index of each decode feed; null when all are
	// decs is where the decode batch attends in each group's layers.
	decs []groupDec
	// longrope: the tokens whose sequence has passed the original
	// context (longAll: every token; longMask [N, 1, 1, 1] when some).
	longAll  bool
	longMask arr
	// With the pool kernel (model.pooled), what it reads besides decs'
	// rows:
	pooled bool
	posf   arr // [len(dec)] float32 position of each decode feed's token times the RoPE scale
	invf   arr // [D/2] float32 RoPE inverse frequencies
	qscale arr // [1] float32 the queries' scale
	pre    []*preGroup
	start  []int     // first packed token of each feed
	perm   arr       // [n] token order from [decode outputs..., prefill outputs...]; null when the same
	lora   *loraPlan // the adapted tokens (lora.go); nil when no feed has an adapter
}

// groupDec is where the decode batch attends in one group's layers:
// gathered, all (every row of each feed) on full-attention layers and
// win (the last Window rows) on sliding ones, nil where not needed (win
// while no feed has left the window: all serves); or with the pool
// kernel each feed's rows [B, T] (0 past its end: full layers every row,
// a sliding group's the last Window) and how many it attends, lens [B].
type groupDec struct {
	all, win   *decAttn
	rows, lens arr
}

// preGroup is prefill feeds (more than one token) of the same length at
// the same position, which attend in one causal call.
type preGroup struct {
	feeds  []int
	t, all int // tokens fed, and rows attended (position + t), per feed
	q      arr // [G*t] packed token of each query row; null for one feed
	// idx is each group's rows [0, all) for its full-attention layers;
	// old is each group's rows [lo, all-t) before this step for its
	// sliding layers, which attend them and this step's keys as computed
	// (the pool does not keep every new row of a sliding group). Null
	// where the group has none.
	idx, old []kvIdx
	lo       int // first position a sliding layer's first query sees
	// mask is the causal mask [t, all] (true: attend), made only for
	// soft-capped attention; band is the sliding layers' mask [t,
	// all-lo] once a query has left the window (null before).
	mask, band arr
}

// decAttn is where a decode batch attends: rows of the pool [B,
// kvHeads, T] (headRows) and, unless every feed attends T rows, an
// additive mask [B, 1, 1, T] (0 where a position is attended, -inf past
// a sequence's end).
type decAttn struct {
	idx kvIdx
	msk arr
	t   int
}

// kvIdx is where attention gathers keys and values: [B, kvHeads, T] rows
// of the pool each (headRows).
type kvIdx struct{ k, v arr }

func (m *model) plan(g *graph, feeds []feed) *stepPlan {
	p := &stepPlan{start: make([]int, len(feeds))}
	writes := make([][]int32, len(m.pool.lay.groups))
	for i, f := range feeds {
		p.start[i] = p.n
		p.n += len(f.tokens)
		at, t := len(f.seq.tokens), len(f.tokens)
		for gi := range writes {
			writes[gi] = append(writes[gi], f.seq.kv[gi].span(at, at+t)...)
		}
		if t == 1 {
			p.dec = append(p.dec, i)
			continue
		}
		j := slices.IndexFunc(p.pre, func(x *preGroup) bool { return x.t == t && x.all == at+t })
		if j < 0 {
			j = len(p.pre)
			p.pre = append(p.pre, &preGroup{t: t, all: at + t})
		}
		p.pre[j].feeds = append(p.pre[j].feeds, i)
	}
	p.writes = make([]arr, len(writes))
	for gi, w := range writes {
		p.writes[gi] = m.kvRows(g, gi, w)
	}
	p.lora = m.planLoRA(g, feeds, p)
	order := make([]int32, 0, p.n) // token index of each output, decode first
	for _, i := range p.dec {
		order = append(order, int32(p.start[i]))
	}
	for _, grp := range p.pre {
		var q []int32
		for _, i := range grp.feeds {
			for j := range grp.t {
				q = append(q, int32(p.start[i]+j))
			}
		}
		order = append(order, q...)
		if len(grp.feeds) > 1 {
			grp.q = g.int32s(q, len(q))
		}
		m.planPrefill(g, feeds, grp)
	}
	m.planLongRoPE(g, feeds, p)
	p.perm = permutation(g, order)
	if len(p.dec) > 0 {
		m.planDecodes(g, feeds, p)
	}
	return p
}

// permutation is the token order [n] from order (the token index of each
// output), null when it is the identity.
func permutation(g *graph, order []int32) arr {
	same := true
	for i, t := range order {
		same = same && int(t) == i
	}
	if same {
		return arr{}
	}
	perm := make([]int32, len(order))
	for i, t := range order {
		perm[t] = int32(i)
	}
	return g.int32s(perm, len(perm))
}

// planPrefill lays out a prefill group's keys in each layer group: the
// rows full-attention layers gather, the earlier rows sliding layers'
// windows read, and their masks. Queries are at positions all-t ..
// all-1; the first sees keys from all-t-Window+1 on.
func (m *model) planPrefill(g *graph, feeds []feed, grp *preGroup) {
	c, lay := m.cfg, m.pool.lay
	t, all, w := grp.t, grp.all, c.Window
	at, b := all-t, len(grp.feeds)
	if c.AttnCap != 0 {
		grp.mask = bandMask(g, at, t, 0, all, 0)
	}
	if w > 0 {
		grp.lo = max(0, at-w+1)
		if all > w {
			grp.band = bandMask(g, at, t, grp.lo, all-grp.lo, w)
		}
	}
	rows := func(gi, lo, hi int) []int32 {
		var out []int32
		for _, i := range grp.feeds {
			out = append(out, feeds[i].seq.kv[gi].span(lo, hi)...)
		}
		return out
	}
	grp.idx, grp.old = make([]kvIdx, len(lay.groups)), make([]kvIdx, len(lay.groups))
	for gi := range lay.groups {
		if lay.hasFull[gi] {
			grp.idx[gi] = m.headRows(g, gi, rows(gi, 0, all), b, all)
		}
		if lay.hasWin[gi] && at > grp.lo {
			grp.old[gi] = m.headRows(g, gi, rows(gi, grp.lo, at), b, at-grp.lo)
		}
	}
}

// planDecodes lays out where the decode feeds attend in every group.
func (m *model) planDecodes(g *graph, feeds []feed, p *stepPlan) {
	if len(p.dec) != len(feeds) {
		q := make([]int32, len(p.dec))
		for j, i := range p.dec {
			q[j] = int32(p.start[i])
		}
		p.decQ = g.int32s(q, len(q))
	}
	p.decs = make([]groupDec, len(m.pool.lay.groups))
	if m.pooled(g) {
		m.planPooled(g, feeds, p)
		return
	}
	w, slid := m.cfg.Window, false
	for _, i := range p.dec {
		slid = slid || (w > 0 && len(feeds[i].seq.tokens)+1 > w)
	}
	lay := m.pool.lay
	for gi := range p.decs {
		win := lay.hasWin[gi] && slid
		if lay.hasFull[gi] || !win {
			d := m.planDecode(g, gi, m.decodeRows(feeds, p.dec, gi, 0))
			p.decs[gi].all = &d
		}
		if win {
			d := m.planDecode(g, gi, m.decodeRows(feeds, p.dec, gi, w))
			p.decs[gi].win = &d
		}
	}
}

// decodeRows is each decode feed's rows in group gi, this step's
// included: the last win of them, or every one when win is 0.
func (m *model) decodeRows(feeds []feed, dec []int, gi, win int) [][]int32 {
	out := make([][]int32, len(dec))
	for j, i := range dec {
		s := feeds[i].seq
		n, lo := len(s.tokens)+1, 0
		if win > 0 {
			lo = max(0, n-win)
		}
		out[j] = s.kv[gi].span(lo, n)
	}
	return out
}

// planDecode lays out decode attention over rows of group gi (B lists of T_b rows each): unpadded
// and unmasked when every feed attends as many rows (MLX's fused decode
// attention takes only unmasked calls), else padded to a multiple of
// kvPad with a mask.
func (m *model) planDecode(g *graph, gi int, rows [][]int32) decAttn {
	var d decAttn
	uniform := true // every decode feed attends as many rows
	for _, r := range rows {
		uniform = uniform && (d.t == 0 || len(r) == d.t)
		d.t = max(d.t, len(r))
	}
	b := len(rows)
	if uniform {
		idx := make([]int32, 0, b*d.t)
		for _, r := range rows {
			idx = append(idx, r...)
		}
		d.idx = m.headRows(g, gi, idx, b, d.t)
		return d
	}
	d.t = (d.t + kvPad - 1) / kvPad * kvPad
	t := d.t
	idx, msk := make([]int32, b*t), make([]float32, b*t)
	ninf := float32(math.Inf(-1))
	for j, r := range rows {
		copy(idx[j*t:], r)
		for x := len(r); x < t; x++ {
			idx[j*t+x] = r[0] // masked; any row of the sequence's own
			msk[j*t+x] = ninf
		}
	}
	d.idx = m.headRows(g, gi, idx, b, t)
	d.msk = g.astype(g.float32s(msk, b, 1, 1, t), m.w.dtype)
	return d
}

// planPooled lays out the decode feeds' rows for the pool kernel: in a
// group with full-attention layers every row (the kernel applies a
// sliding layer's window itself), in a sliding group the window's.
func (m *model) planPooled(g *graph, feeds []feed, p *stepPlan) {
	b := len(p.dec)
	pos := make([]float32, b)
	for j, i := range p.dec {
		pos[j] = float32(len(feeds[i].seq.tokens)) * m.ropeScale()
	}
	p.pooled = true
	p.posf, p.invf = g.float32s(pos, b), g.float32s(m.w.invf, len(m.w.invf))
	p.qscale = g.float32s([]float32{m.cfg.attnScale()}, 1)
	lay := m.pool.lay
	for gi := range p.decs {
		win := 0
		if !lay.hasFull[gi] {
			win = m.cfg.Window
		}
		p.decs[gi].rows, p.decs[gi].lens = poolRows(g, m.decodeRows(feeds, p.dec, gi, win))
	}
}

// poolRows is rows (B lists) as the pool kernel reads them: [B, T], T
// the longest, 0 past a list's end, and the lengths [B].
func poolRows(g *graph, rows [][]int32) (arr, arr) {
	b, t := len(rows), 0
	lens := make([]int32, b)
	for j, r := range rows {
		lens[j] = int32(len(r))
		t = max(t, len(r))
	}
	flat := make([]int32, b*t)
	for j, r := range rows {
		copy(flat[j*t:], r)
	}
	return g.int32s(flat, b, t), g.int32s(lens, b)
}

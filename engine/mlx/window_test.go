//go:build mlx

package mlx

import (
	"context"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/metal"
	"github.com/mlxserving/mlxserving/testmodel"
)

// Sliding windows in the KV pool (kvgroups.go): every test compares the
// pool with a sliding group against the pool that keeps every row
// (keepWindows), on TinyFamily checkpoints whose windows are 16, so the
// sliding group keeps 47 positions and is charged 62 rows at most.

// keepWindows is the option that keeps every row of sliding layers.
func keepWindows(o *options) error {
	o.keepWindows = true
	return nil
}

// windowDir writes TinyFamily(arch), with edit applied unless nil.
func windowDir(t *testing.T, arch string, edit func(*testmodel.Config)) string {
	t.Helper()
	cfg := testmodel.TinyFamily(arch)
	if edit != nil {
		edit(&cfg)
	}
	return writeTiny(t, cfg)
}

// loadWindows loads dir on e and checks whether its pool has a sliding
// group.
func loadWindows(t testing.TB, e *Engine, dir string, spec engine.ModelSpec, grouped bool) *model {
	t.Helper()
	spec.ID, spec.Path = "tiny", dir
	mi, err := e.Load(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mi.Close() })
	m := mi.(*model)
	if got := m.lay.sliding(); got != grouped {
		t.Fatalf("a sliding group: %v, want %v", got, grouped)
	}
	return m
}

// heldLayerRows is the pool's rows somebody holds times the layers of
// their group: the keys and values it keeps, in layer rows.
func heldLayerRows(m *model) int {
	n := 0
	_ = m.call(func(*graph) error {
		for gi, rp := range m.pool.groups {
			n += (len(rp.refs) - len(rp.free)) * len(m.lay.groups[gi])
		}
		return nil
	})
	return n
}

// TestSlidingGroupsSameTokens: greedy tokens of every family with a
// window, prefilled whole, in chunks of 9 and batched with other
// prompts, and generated well past the rows a sliding group keeps, are
// the tokens of the pool that keeps every row.
func TestSlidingGroupsSameTokens(t *testing.T) {
	grouped, kept := newEngine(t), newEngine(t, keepWindows)
	ps := [][]int32{refPrompt(1, 40), refPrompt(2, 150), refPrompt(3, 7)}
	const n = 100
	for _, arch := range []string{"mistral", "mixtral", "gemma2", "gemma3_text"} {
		t.Run(arch, func(t *testing.T) {
			dir := windowDir(t, arch, nil)
			m := loadWindows(t, grouped, dir, engine.ModelSpec{}, true)
			ref := loadWindows(t, kept, dir, engine.ModelSpec{}, false)
			for i, p := range ps {
				want, _ := generate(t, ref, 1, p, n, len(p), nil)
				for _, chunk := range []int{len(p), 9} {
					if got, _ := generate(t, m, 1, p, n, chunk, nil); !slices.Equal(got, want) {
						t.Fatalf("prompt %d in chunks of %d: %v, keeping every row %v", i, chunk, got, want)
					}
				}
			}
			got, want := generateBatch(t, m, ps, n, nil), generateBatch(t, ref, ps, n, nil)
			for i := range ps {
				if !slices.Equal(got[i], want[i]) {
					t.Fatalf("prompt %d batched: %v, keeping every row %v", i, got[i], want[i])
				}
			}
			if free := m.FreeBlocks(); free != m.info.KVBlocks {
				t.Fatalf("FreeBlocks %d of %d after every sequence was freed", free, m.info.KVBlocks)
			}
		})
	}
}

// TestSlidingGroupsBounded: as a sequence grows, FreeBlocks goes down by
// BlocksFor, and the pool holds every position of the full layers and
// the last 47 of the sliding ones: far fewer layer rows than the pool
// that keeps every row.
func TestSlidingGroupsBounded(t *testing.T) {
	e := newEngine(t)
	for _, arch := range []string{"gemma3_text", "mistral"} {
		t.Run(arch, func(t *testing.T) {
			m := loadWindows(t, e, windowDir(t, arch, nil), engine.ModelSpec{KVCapacity: 400}, true)
			info, lay := m.Info(), m.lay
			ctx := context.Background()
			p := refPrompt(4, 30)
			if _, err := m.Open(ctx, 1, p, ""); err != nil {
				t.Fatal(err)
			}
			defer m.Free(1, "")
			tok, err := feedOne(m, 1, p, true)
			for n := len(p); err == nil && n < 330; n++ {
				if n%50 == 0 || n == len(p) {
					if free := m.FreeBlocks(); free != info.KVBlocks-info.BlocksFor(n) {
						t.Fatalf("%d tokens: FreeBlocks %d, want %d", n, free, info.KVBlocks-info.BlocksFor(n))
					}
					want := 0
					for gi, ls := range lay.groups {
						want += len(ls) * lay.keeps(gi, n)
					}
					if got := heldLayerRows(m); got != want {
						t.Fatalf("%d tokens: %d layer rows held, want %d", n, got, want)
					}
					t.Logf("%d tokens: %d layer rows held, %d keeping every row", n, want, n*m.cfg.Layers)
				}
				tok, err = feedOne(m, 1, []int32{tok}, true)
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSlidingGroupsAdmitMore: eight 404-token requests, at most four at
// once, on two pools of the same memory. Keeping every row, it holds two
// of them; with the sliding group (a Gemma 3 of one full layer and five
// sliding ones; a Mistral whose every layer slides) all four run at
// once, never preempted, with the tokens each gets alone.
func TestSlidingGroupsAdmitMore(t *testing.T) {
	grouped, kept := newEngine(t), newEngine(t, keepWindows)
	gemma := func(c *testmodel.Config) { c.Layers, c.SlidingPattern = 6, 6 }
	for _, tc := range []struct {
		arch     string
		edit     func(*testmodel.Config)
		capacity int // the pool of the same memory: 808 tokens' rows kept
	}{{"gemma3_text", gemma, 808*6 - 5*5*47}, {"mistral", nil, 808}} {
		t.Run(tc.arch, func(t *testing.T) {
			dir := windowDir(t, tc.arch, tc.edit)
			ref := loadWindows(t, kept, dir, engine.ModelSpec{KVCapacity: 808, MaxBatch: 4}, false)
			m := loadWindows(t, grouped, dir, engine.ModelSpec{KVCapacity: tc.capacity, MaxBatch: 4}, true)
			if m.info.KVBytes > ref.info.KVBytes {
				t.Fatalf("the pool takes %d bytes, %d keeping every row", m.info.KVBytes, ref.info.KVBytes)
			}
			peaks := map[bool]int64{}
			for _, sliding := range []bool{false, true} {
				mm := ref
				if sliding {
					mm = m
				}
				seqs := make([]*batcher.Sequence, 8)
				for i := range seqs {
					seqs[i] = &batcher.Sequence{Prompt: refPrompt(10+i, 400), MaxTokens: 4, IgnoreEOS: true}
				}
				var bp batchPeak
				res, st := runBatched(t, mm, seqs, batcher.WithStepObserver(bp.observe), batcher.WithTokenBudget(8*400))
				for i, got := range res {
					want, _ := generate(t, ref, 1, seqs[i].Prompt, 4, 400, nil)
					if got.err != nil || got.finish != api.FinishLength || !slices.Equal(got.tokens, want) {
						t.Fatalf("sliding group %v: request %d: %v (%v, %q), alone %v", sliding, i, got.tokens, got.err, got.finish, want)
					}
				}
				peaks[sliding] = bp.peak.Load()
				t.Logf("sliding group %v: %d KV bytes, %d blocks, a request takes %d: %d run at once, %d block preemptions",
					sliding, mm.info.KVBytes, mm.info.KVBlocks, mm.info.BlocksFor(404), bp.peak.Load(), st.BlockPreemptions)
				if sliding && st.BlockPreemptions != 0 {
					t.Errorf("%d block preemptions with the sliding group", st.BlockPreemptions)
				}
			}
			if peaks[false] != 2 || peaks[true] != 4 {
				t.Errorf("%d requests at once keeping every row, %d with the sliding group; want 2 and 4", peaks[false], peaks[true])
			}
		})
	}
}

// TestSlidingGroupsPrefixReuse: a saved prefix of 129 tokens keeps its
// sliding rows of the last 47 positions. A prompt that extends it
// reuses all of it, one that leaves it within 32 tokens of its end
// reuses the common part, and one that leaves it earlier, where the
// window of its next position was given back, reuses nothing and
// recomputes. Every one samples the tokens it samples alone.
func TestSlidingGroupsPrefixReuse(t *testing.T) {
	dir := windowDir(t, "gemma3_text", nil)
	m := loadWindows(t, newEngine(t), dir, engine.ModelSpec{}, true)
	ref := loadWindows(t, newEngine(t, keepWindows), dir, engine.ModelSpec{}, false)
	ctx := context.Background()
	a := refPrompt(5, 120)
	out, _ := generate(t, ref, 1, a, 10, len(a), nil)
	fed := append(slices.Clone(a), out[:9]...) // the tokens a sequence of a feeds
	if _, err := m.Open(ctx, 1, a, ""); err != nil {
		t.Fatal(err)
	}
	for i, tok := range append([]int32{-1}, out[:9]...) {
		toks := []int32{tok}
		if i == 0 {
			toks = a
		}
		if _, err := feedOne(m, 1, toks, true); err != nil {
			t.Fatal(err)
		}
	}
	m.Free(1, "a")
	for _, tc := range []struct{ keep, reuse int }{{129, 129}, {100, 100}, {97, 97}, {96, 0}, {60, 0}} {
		p := append(slices.Clone(fed[:tc.keep]), 7, 8, 9)
		id := engine.SeqID(10 + tc.keep)
		r, err := m.Open(ctx, id, p, "a")
		if err != nil || r != tc.reuse {
			t.Fatalf("a prompt sharing %d tokens: reused %d, %v; want %d", tc.keep, r, err, tc.reuse)
		}
		got := greedyFrom(t, m, id, p[r:], 20)
		m.Free(id, "")
		if want, _ := generate(t, ref, 1, p, 20, len(p), nil); !slices.Equal(got, want) {
			t.Fatalf("a prompt sharing %d tokens, %d reused: %v, alone %v", tc.keep, r, got, want)
		}
	}
}

// greedyFrom feeds toks to the open sequence id and returns the n
// greedy tokens that follow.
func greedyFrom(t *testing.T, m *model, id engine.SeqID, toks []int32, n int) []int32 {
	t.Helper()
	var out []int32
	for len(out) < n {
		tok, err := feedOne(m, id, toks, true)
		if err != nil {
			t.Fatal(err)
		}
		out, toks = append(out, tok), []int32{tok}
	}
	return out
}

// TestSlidingGroupsRandomWorkloads: TestPagedRandomWorkloads' workloads
// (preemptions, saved prefixes reused or recomputed, cancellations) on a
// Gemma 3 checkpoint with sliding groups, against the pool that keeps
// every row.
func TestSlidingGroupsRandomWorkloads(t *testing.T) {
	dir := windowDir(t, "gemma3_text", nil)
	ref := loadWindows(t, newEngine(t, keepWindows), dir, engine.ModelSpec{}, false)
	randomWorkloads(t, newEngine(t), dir, ref)
}

// TestSlidingGroupsPeak: a step gives back the sliding rows it neither
// reads nor keeps before it takes its own, so while it runs a sequence
// holds the 47 positions the group keeps, or, in a chunk of 47 tokens or
// more after the first, the window's 15 before it besides: never more
// than WindowBlocks. The prompt goes in chunks of 60, 60, 9 and 71, then
// decodes.
func TestSlidingGroupsPeak(t *testing.T) {
	m := loadWindows(t, newEngine(t), windowDir(t, "gemma3_text", nil), engine.ModelSpec{}, true)
	lay := m.lay
	p := refPrompt(7, 200)
	if _, err := m.Open(context.Background(), 1, p, ""); err != nil {
		t.Fatal(err)
	}
	defer m.Free(1, "")
	steps := []struct{ t, held int }{{60, 47}, {60, 62}, {9, 47}, {71, 62}, {1, 47}, {1, 47}, {1, 47}}
	if lay.windowBlocks() != 62 {
		t.Fatalf("WindowBlocks %d, want 62", lay.windowBlocks())
	}
	at, tok := 0, int32(0)
	for _, st := range steps {
		toks := []int32{tok}
		if at < len(p) {
			toks = p[at : at+st.t]
		}
		held := 0
		err := m.call(func(*graph) error {
			fs, _, err := m.feeds([]engine.StepInput{{Seq: 1, Tokens: toks}}, nil)
			if err == nil {
				err = m.rowsFor(fs)
			}
			if err != nil {
				return err
			}
			rp := &m.pool.groups[len(m.pool.groups)-1]
			held = len(rp.refs) - len(rp.free)
			m.pool.drop(fs[0].seq, at) // the step below takes them again
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if held != st.held {
			t.Fatalf("%d tokens at %d: the sliding group holds %d rows while the step runs, want %d", len(toks), at, held, st.held)
		}
		if tok, err = feedOne(m, 1, toks, true); err != nil {
			t.Fatal(err)
		}
		at += len(toks)
	}
}

// TestSlidingGroupsWriteInPlace: MLX updates the pool's arrays of both
// groups in place: a step's peak memory stays far below one array's
// size (the sliding group's rows for a batch of 64, so that a step's
// other buffers stay well below a quarter of it).
func TestSlidingGroupsWriteInPlace(t *testing.T) {
	m := loadWindows(t, newEngine(t), windowDir(t, "gemma3_text", nil), engine.ModelSpec{KVCapacity: 100000, MaxBatch: 64}, true)
	c := m.cfg
	array := uint64(2*m.rows[1]*c.KVHeads*c.HeadDim) * 4
	p := refPrompt(6, 60)
	if _, err := m.Open(context.Background(), 1, p, ""); err != nil {
		t.Fatal(err)
	}
	defer m.Free(1, "")
	tok, err := feedOne(m, 1, p, true)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		var before metal.Memory
		_ = m.call(func(*graph) error {
			before, err = metal.ReadMemory()
			if err == nil {
				err = metal.ResetPeakMemory()
			}
			return err
		})
		if err != nil {
			t.Skip("memory counters:", err)
		}
		if tok, err = feedOne(m, 1, []int32{tok}, true); err != nil {
			t.Fatal(err)
		}
		var after metal.Memory
		_ = m.call(func(*graph) error { after, err = metal.ReadMemory(); return err })
		if grew := after.Peak - before.Active; err != nil || grew > array/4 {
			t.Fatalf("a decode step's peak is %d bytes over the memory before it (%v); a pool array is %d: the step copied it", grew, err, array)
		}
	}
}

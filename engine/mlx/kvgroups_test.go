package mlx

import (
	"testing"

	"github.com/mlxserving/mlxserving/testmodel"
)

// gemma3Like is testmodel.Gemma3_12B's layout as the engine reads it: 48
// layers, every sixth global, the others sliding over 1024 positions, 8
// key/value heads of 256.
func gemma3Like() *modelConfig {
	g := testmodel.Gemma3_12B()
	c := &modelConfig{Layers: g.Layers, KVHeads: g.KVHeads, HeadDim: g.HeadSize, ContextLength: g.ContextLength}
	c.Window, c.Sliding = g.SlidingWindow, interleaved(g.Layers, g.SlidingPattern)
	return c
}

// TestSlidingLayout groups Gemma 3's layers and Mistral's: a full group
// of the global layers and a sliding one, or the sliding one alone; one
// group of every layer when the window frees nothing in the context.
func TestSlidingLayout(t *testing.T) {
	c := gemma3Like()
	l := newKVLayout(c, c.ContextLength)
	if len(l.groups) != 2 || len(l.groups[0]) != 8 || len(l.groups[1]) != 40 || l.slides[0] || !l.sliding() {
		t.Fatalf("Gemma 3: groups of %d and %d layers, slides %v; want 8 full and 40 sliding", len(l.groups[0]), len(l.groups[len(l.groups)-1]), l.slides)
	}
	if l.keep != 1024-1+windowSlack || l.windowBlocks() != 1024-1+l.keep {
		t.Fatalf("keeps %d, charged %d", l.keep, l.windowBlocks())
	}
	if got := newKVLayout(c, 2000); len(got.groups) != 1 || got.sliding() {
		t.Fatal("a 2000-token context: want one group of every layer, the window frees nothing in it")
	}
	m := &modelConfig{Layers: 4}
	m.Window, m.Sliding = 16, []bool{true, true, true, true}
	if l := newKVLayout(m, 512); len(l.groups) != 1 || !l.sliding() {
		t.Fatal("every layer slides: want the sliding group alone")
	}
}

// TestSlidingKVFootprint measures what a Gemma-3-12B-like sequence of
// 131,072 tokens holds in the pool, bf16: every row of every layer
// before the sliding group, the full layers' rows and 1,055 positions of
// the sliding layers' after; and the blocks admission counts it, in
// bytes. Run with -v for the figures (BENCHMARKS.md).
func TestSlidingKVFootprint(t *testing.T) {
	c := gemma3Like()
	const n, maxBatch = 131072, 16
	rowBytes := uint64(2 * c.KVHeads * c.HeadDim * 2) // one layer's keys and values of a token, bf16
	kept, l := oneGroup(c), newKVLayout(c, n)
	before := uint64(n*c.Layers) * rowBytes
	held := l.bytes([]int{n, l.keeps(1, n)}, rowBytes)
	charged := l.bytes([]int{n, 0}, rowBytes) // a block is a token's row of the full group
	shared := l.bytes([]int{0, l.rows(1<<30, maxBatch)[1]}, rowBytes)
	t.Logf("Gemma-3-12B-like, %d tokens: held %.2f GiB keeping every row (%d layer rows), %.2f GiB with the sliding group (%.3f of it)",
		n, gib(before), n*c.Layers, gib(held), float64(held)/float64(before))
	t.Logf("admission counts %.2f GiB a sequence (%.3f), beside one sliding pool of %.2f GiB for %d sequences' kept positions",
		gib(charged), float64(charged)/float64(before), gib(shared), maxBatch+1)
	if len(kept.groups) != 1 || float64(held) > float64(before)/5.5 {
		t.Errorf("a 128k sequence holds %.3f of a full KV; want about a sixth", float64(held)/float64(before))
	}
	if want := l.bytes([]int{0, (maxBatch + 1) * l.keep}, rowBytes); shared != want {
		t.Errorf("the sliding pool takes %.2f GiB at MaxBatch %d; want %.2f, %d sequences' kept positions", gib(shared), maxBatch, gib(want), maxBatch+1)
	}
}

func gib(b uint64) float64 { return float64(b) / (1 << 30) }

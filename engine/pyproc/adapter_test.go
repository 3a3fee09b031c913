package pyproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/testmodel"
)

// loraCase is a base checkpoint, an adapter over it and the checkpoint
// with the adapter merged in (testmodel's reference).
type loraCase struct {
	base, adapter, merged string
}

// writeLoRA writes base, the adapter ad over it and the merged checkpoint
// into fresh directories.
func writeLoRA(t testing.TB, base testmodel.Config, ad testmodel.Adapter) loraCase {
	t.Helper()
	dir, c := enginetest.WriteAdapterCase(t, base, ad)
	return loraCase{base: dir, adapter: c.Dir, merged: c.Merged}
}

func loadSpec(t testing.TB, e *Engine, spec engine.ModelSpec) *Model {
	t.Helper()
	m, err := e.Load(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m.(*Model)
}

func addAdapter(t testing.TB, m *Model, name, dir string) engine.AdapterInfo {
	t.Helper()
	info, err := m.AddAdapter(context.Background(), engine.AdapterSpec{Name: name, Path: dir})
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// generateWith is generate for a sequence opened with adapter.
func generateWith(t testing.TB, m *Model, seq engine.SeqID, p []int32, n int, adapter string) []int32 {
	t.Helper()
	ctx := context.Background()
	r, err := m.OpenAdapter(ctx, seq, p, "", adapter)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free(seq, "")
	feed := p[r:]
	var out []int32
	for len(out) < n {
		o, err := m.Step(ctx, []engine.StepInput{{Seq: seq, Tokens: feed, Sample: true, Params: greedy}})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, o[0].Token)
		feed = []int32{o[0].Token}
	}
	return out
}

// TestAdapterEqualsMerged: a sequence run with an adapter decodes the
// greedy tokens of the checkpoint with the adapter merged into its
// weights, for split and fused projections, biases, PEFT's and mlx-lm's
// layouts, rsLoRA, a subset of modules and layers; the base's tokens
// differ (the adapter does something).
func TestAdapterEqualsMerged(t *testing.T) {
	e := newEngine(t)
	qwen := testmodel.TinyFamily("qwen2")
	cases := []struct {
		name string
		base testmodel.Config
		ad   testmodel.Adapter
	}{
		{"llama peft", testmodel.Tiny(), testmodel.Adapter{Rank: 8, Seed: 1}},
		{"llama peft rslora", testmodel.Tiny(), testmodel.Adapter{Rank: 4, RSLoRA: true, Alpha: 3, Seed: 2}},
		{"llama mlx", testmodel.Tiny(), testmodel.Adapter{Rank: 8, MLX: true, Seed: 6}},
		{"llama bf16 partial", testmodel.Tiny(), testmodel.Adapter{Rank: 16, DType: "bfloat16", Seed: 3, Layers: []int{1},
			Targets: []string{"self_attn.k_proj", "self_attn.o_proj", "mlp.up_proj"}}},
		{"qwen2 biases", qwen, testmodel.Adapter{Rank: 8, Seed: 4}},
		{"phi3 fused", testmodel.TinyFamily("phi3"), testmodel.Adapter{Rank: 8, Seed: 5, MLX: true}},
		{"qwen3", testmodel.TinyFamily("qwen3"), testmodel.Adapter{Rank: 8, Seed: 7}},
		// Experts are not adapted: attention everywhere, the MLP of the dense layer 1.
		{"qwen3_moe dense mlp", testmodel.TinyFamily("qwen3_moe"), testmodel.Adapter{Rank: 8, Seed: 8, Layers: []int{1},
			Targets: []string{"self_attn.q_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.down_proj"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := writeLoRA(t, tc.base, tc.ad)
			m := loadSpec(t, e, engine.ModelSpec{ID: "base", Path: c.base})
			ref := loadSpec(t, e, engine.ModelSpec{ID: "merged", Path: c.merged})
			if info := m.Info(); info.AdapterSlots != engine.DefaultAdapterSlots || info.MaxAdapterRank != engine.DefaultMaxAdapterRank {
				t.Fatalf("info: %d slots, max rank %d", info.AdapterSlots, info.MaxAdapterRank)
			}
			info := addAdapter(t, m, "ft", c.adapter)
			if info.Rank != tc.ad.Rank || info.Bytes <= 0 || info.Layers == 0 {
				t.Fatalf("adapter info %+v", info)
			}
			p := prompt(7, 21)
			want := generate(t, ref, 1, p, 12)
			got := generateWith(t, m, 2, p, 12, "ft")
			if !slices.Equal(got, want) {
				t.Fatalf("adapter: %v\nmerged:  %v", got, want)
			}
			if base := generate(t, m, 3, p, 12); slices.Equal(base, want) {
				t.Fatalf("the base decodes the merged tokens too (%v): the adapter changes nothing", base)
			}
			if got := generateWith(t, m, 4, p, 12, "ft"); !slices.Equal(got, want) { // resident now: no load
				t.Fatalf("again: %v, want %v", got, want)
			}
		})
	}
}

// TestAdapterBatchMix runs the base and two adapters in the same steps
// (two sequences of one adapter, prompts of different lengths fed in
// chunks beside decodes): each sequence gets exactly what it gets alone,
// and an adapter alone what its merged checkpoint gets.
func TestAdapterBatchMix(t *testing.T) { batchMix(t, Tuning{}) }

// TestAdapterBatchMixDense is TestAdapterBatchMix with every step's
// delta, prompt chunks' too, computed as the CUDA graphs compute it
// (lora.DensePlan: every slot's products, those of other slots zeroed).
func TestAdapterBatchMixDense(t *testing.T) {
	batchMix(t, Tuning{DenseLoRA: true})
}

func batchMix(t *testing.T, tu Tuning) {
	e := newEngine(t, WithTuning(tu))
	cx := writeLoRA(t, testmodel.Tiny(), testmodel.Adapter{Rank: 8, Seed: 11})
	ay := filepath.Join(t.TempDir(), "y")
	if err := testmodel.WriteAdapter(ay, testmodel.Tiny(), testmodel.Adapter{Rank: 4, Seed: 12, MLX: true}); err != nil {
		t.Fatal(err)
	}
	m := loadSpec(t, e, engine.ModelSpec{ID: "base", Path: cx.base})
	addAdapter(t, m, "x", cx.adapter)
	addAdapter(t, m, "y", ay)
	const n = 8
	prompts := [][]int32{prompt(1, 19), prompt(2, 5), prompt(3, 33), prompt(4, 12), prompt(5, 26)}
	adapters := []string{"x", "", "y", "x", ""}
	want := make([][]int32, len(prompts))
	for i, p := range prompts {
		want[i] = generateWith(t, m, engine.SeqID(100+i), p, n, adapters[i])
	}
	if slices.Equal(want[0], generate(t, m, 200, prompts[0], n)) {
		t.Fatal("adapter x decodes the base's tokens")
	}
	if merged := generate(t, loadSpec(t, e, engine.ModelSpec{ID: "merged", Path: cx.merged}), 1, prompts[0], n); !slices.Equal(want[0], merged) {
		t.Fatalf("adapter x: %v, merged %v", want[0], merged)
	}
	ctx := context.Background()
	// The registry is safe beside steps: an adapter added, listed and
	// removed all along.
	stop, churned := make(chan struct{}), make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				churned <- nil
				return
			default:
			}
			if _, err := m.AddAdapter(ctx, engine.AdapterSpec{Name: "z", Path: ay}); err != nil {
				churned <- err
				return
			}
			_ = m.Adapters()
			if err := m.RemoveAdapter("z"); err != nil {
				churned <- err
				return
			}
		}
	}()
	defer func() {
		close(stop)
		if err := <-churned; err != nil {
			t.Error(err)
		}
	}()
	got := stepAdapters(t, m, prompts, adapters, n)
	for i := range prompts {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("seq %d (adapter %q): batched %v, alone %v", i, adapters[i], got[i], want[i])
		}
	}
}

// stepAdapters opens prompts[i] as sequence i with adapters[i] (""
// the base), runs them together in staggered steps (stepStaggered,
// chunks of 6) for n greedy tokens each, frees them and returns their
// tokens.
func stepAdapters(t *testing.T, m *Model, prompts [][]int32, adapters []string, n int) [][]int32 {
	t.Helper()
	fed := make([]int, len(prompts))
	for i, p := range prompts {
		r, err := m.OpenAdapter(context.Background(), engine.SeqID(i), p, "", adapters[i])
		if err != nil {
			t.Fatal(err)
		}
		fed[i] = r
		defer m.Free(engine.SeqID(i), "")
	}
	return stepStaggered(t, m, prompts, fed, n, 6)
}

// TestAdapterPrefixIsolation: KV saved under a key, or cached, by a
// sequence of one adapter is reused by that adapter only.
func TestAdapterPrefixIsolation(t *testing.T) {
	e := newEngine(t)
	cx := writeLoRA(t, testmodel.Tiny(), testmodel.Adapter{Rank: 8, Seed: 21})
	ay := filepath.Join(t.TempDir(), "y")
	if err := testmodel.WriteAdapter(ay, testmodel.Tiny(), testmodel.Adapter{Rank: 8, Seed: 22}); err != nil {
		t.Fatal(err)
	}
	m := loadSpec(t, e, engine.ModelSpec{ID: "base", Path: cx.base})
	addAdapter(t, m, "x", cx.adapter)
	addAdapter(t, m, "y", ay)
	ctx := context.Background()
	p := prompt(9, 50)
	r, err := m.OpenAdapter(ctx, 1, p, "conv", "x")
	if err != nil || r != 0 {
		t.Fatalf("first open: reused %d, %v", r, err)
	}
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: p, Sample: true, Params: greedy}}); err != nil {
		t.Fatal(err)
	}
	m.Free(1, "conv")
	next := append(slices.Clone(p), prompt(10, 8)...)
	reuse := func(seq engine.SeqID, key, adapter string) int {
		t.Helper()
		r, err := m.OpenAdapter(ctx, seq, next, key, adapter)
		if err != nil {
			t.Fatal(err)
		}
		m.Free(seq, "")
		return r
	}
	for _, tc := range []struct {
		key, adapter string
		reused       bool
	}{
		{"conv", "y", false}, {"conv", "", false}, {"conv", "x", true},
		{"", "y", false}, {"", "", false}, {"", "x", true}, // the prefix cache: x's prompt blocks
	} {
		if r := reuse(10, tc.key, tc.adapter); (r > 0) != tc.reused {
			t.Errorf("key %q, adapter %q: reused %d, want reuse %v", tc.key, tc.adapter, r, tc.reused)
		}
	}
	// x added again (other weights): another adapter to the caches; the
	// KV the old x saved is dropped and reported.
	if ev := m.EvictedSaved(); len(ev) != 0 {
		t.Fatalf("evicted before any adapter went: %v", ev)
	}
	addAdapter(t, m, "x", ay)
	if ev := m.EvictedSaved(); !slices.Equal(ev, []string{"conv"}) {
		t.Errorf("EvictedSaved after x was replaced: %v, want [conv]", ev)
	}
	if m.SavedWorker("conv") != -1 {
		t.Error("the old x's saved KV is still routed to")
	}
	if r := reuse(11, "conv", "x"); r != 0 {
		t.Errorf("x added again reuses %d tokens of the old x's saved KV", r)
	}
	if r := reuse(12, "", "x"); r != 0 {
		t.Errorf("x added again reuses %d tokens of the old x's cached blocks", r)
	}
	if got, want := generateWith(t, m, 13, p, 6, "x"), generateWith(t, m, 14, p, 6, "y"); !slices.Equal(got, want) {
		t.Errorf("x added again with y's weights: %v, y %v", got, want)
	}
}

// TestAdapterSlots: with one slot, two adapters used in turn evict and
// reload each other and decode their merged checkpoints' tokens; while a
// sequence of one is open, the other's open is ErrOutOfMemory and the
// base still opens.
func TestAdapterSlots(t *testing.T) {
	e := newEngine(t)
	cx := writeLoRA(t, testmodel.Tiny(), testmodel.Adapter{Rank: 8, Seed: 31})
	ay := testmodel.Adapter{Rank: 4, Seed: 32, MLX: true}
	merged := testmodel.Tiny()
	merged.Merge = &ay
	dy, my := filepath.Join(t.TempDir(), "y"), filepath.Join(t.TempDir(), "my")
	if err := testmodel.WriteAdapter(dy, testmodel.Tiny(), ay); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.Write(my, merged); err != nil {
		t.Fatal(err)
	}
	m := loadSpec(t, e, engine.ModelSpec{ID: "base", Path: cx.base, AdapterSlots: 1, MaxAdapterRank: 8})
	if info := m.Info(); info.AdapterSlots != 1 || info.MaxAdapterRank != 8 || info.AdapterBytes <= 0 {
		t.Fatalf("info: %d slots, rank %d, %d bytes of slots", info.AdapterSlots, info.MaxAdapterRank, info.AdapterBytes)
	}
	addAdapter(t, m, "x", cx.adapter)
	addAdapter(t, m, "y", dy)
	p := prompt(4, 14)
	wantX := generate(t, loadSpec(t, e, engine.ModelSpec{ID: "mx", Path: cx.merged}), 1, p, 10)
	wantY := generate(t, loadSpec(t, e, engine.ModelSpec{ID: "my", Path: my}), 1, p, 10)
	for i, name := range []string{"x", "y", "x", "y"} {
		want := map[string][]int32{"x": wantX, "y": wantY}[name]
		if got := generateWith(t, m, engine.SeqID(10+i), p, 10, name); !slices.Equal(got, want) {
			t.Fatalf("round %d, adapter %s: %v, want %v", i, name, got, want)
		}
	}
	ctx := context.Background()
	if _, err := m.OpenAdapter(ctx, 20, p, "", "x"); err != nil {
		t.Fatal(err)
	}
	// On the CPU no graph is captured; on CUDA the decode graphs with the
	// delta are.
	cpu := os.Getenv("MLXSERVING_TEST_DEVICE") != "cuda"
	if st := workerStats(t, e, m); fmt.Sprint(st["adapters"]) != "[x#1]" || (cpu && st["lora_graphs"] != 0.0) {
		t.Errorf("worker stats: adapters %v (want x's key alone), lora graphs %v (none on the CPU)", st["adapters"], st["lora_graphs"])
	}
	if _, err := m.OpenAdapter(ctx, 21, p, "", "y"); !errors.Is(err, engine.ErrOutOfMemory) {
		t.Fatalf("y while x's sequence holds the only slot: %v, want ErrOutOfMemory", err)
	}
	if _, err := m.OpenAdapter(ctx, 22, p, "", "x"); err != nil { // the same adapter shares the slot
		t.Fatal(err)
	}
	if got := generate(t, m, 23, p, 3); len(got) != 3 {
		t.Fatal("the base did not decode")
	}
	m.Free(20, "")
	if _, err := m.OpenAdapter(ctx, 21, p, "", "y"); !errors.Is(err, engine.ErrOutOfMemory) {
		t.Fatalf("y while a sequence of x is still open: %v", err)
	}
	m.Free(22, "")
	if got := generateWith(t, m, 21, p, 10, "y"); !slices.Equal(got, wantY) {
		t.Fatalf("y after x's sequences were freed: %v, want %v", got, wantY)
	}
}

// TestAdapterWorkersAndLookahead: each of two workers keeps its own slot
// (one each: two adapters' sequences open at once, one per worker), and
// with lookahead the tokens decoded ahead are the adapter's.
func TestAdapterWorkersAndLookahead(t *testing.T) {
	e := newEngine(t, WithWorkers(2), WithLookahead(4))
	cx := writeLoRA(t, testmodel.Tiny(), testmodel.Adapter{Rank: 8, Seed: 61})
	ay := filepath.Join(t.TempDir(), "y")
	if err := testmodel.WriteAdapter(ay, testmodel.Tiny(), testmodel.Adapter{Rank: 8, Seed: 62}); err != nil {
		t.Fatal(err)
	}
	m := loadSpec(t, e, engine.ModelSpec{ID: "base", Path: cx.base, AdapterSlots: 1})
	addAdapter(t, m, "x", cx.adapter)
	addAdapter(t, m, "y", ay)
	p := prompt(6, 13)
	want := generate(t, loadSpec(t, e, engine.ModelSpec{ID: "merged", Path: cx.merged}), 1, p, 12)
	ctx := context.Background()
	if _, err := m.OpenAdapter(ctx, 1, p, "", "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.OpenAdapter(ctx, 2, p, "", "y"); err != nil { // the other worker's slot
		t.Fatal(err)
	}
	if m.seqs[1].proc == m.seqs[2].proc {
		t.Fatal("both sequences on one worker")
	}
	feed := [][]int32{p, p}
	var got [2][]int32
	for range 12 {
		outs, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: feed[0], Sample: true, Params: greedy},
			{Seq: 2, Tokens: feed[1], Sample: true, Params: greedy}})
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range outs {
			got[i] = append(got[i], o.Token)
			feed[i] = []int32{o.Token}
		}
	}
	m.Free(1, "")
	m.Free(2, "")
	if !slices.Equal(got[0], want) {
		t.Fatalf("x with lookahead: %v, merged %v", got[0], want)
	}
	if slices.Equal(got[1], want) {
		t.Fatal("y decodes x's tokens")
	}
	// x's sequence on one worker, the base's on the other: y, routed to
	// the first (equal loads), goes where a slot is free; a third adapter
	// finds none anywhere.
	if _, err := m.OpenAdapter(ctx, 3, p, "", "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Open(ctx, 4, p, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := m.OpenAdapter(ctx, 5, p, "", "y"); err != nil {
		t.Fatalf("y with a slot free on one worker: %v", err)
	}
	if m.seqs[3].proc == m.seqs[5].proc {
		t.Fatal("x and y share a worker of one slot")
	}
	addAdapter(t, m, "z", ay)
	if _, err := m.OpenAdapter(ctx, 6, p, "", "z"); !errors.Is(err, engine.ErrOutOfMemory) {
		t.Fatalf("z with every slot in use: %v", err)
	}
	// x's worker carries one sequence, the other none, within the load
	// bound: a new sequence of x goes where x is resident (the least
	// loaded worker would evict y for it).
	holder := m.seqs[3].proc
	m.Free(4, "")
	m.Free(5, "")
	if _, err := m.OpenAdapter(ctx, 7, p, "", "x"); err != nil {
		t.Fatal(err)
	}
	if m.seqs[7].proc != holder {
		t.Error("a sequence of x went to the worker that does not hold x")
	}
	for _, s := range []engine.SeqID{3, 7} {
		m.Free(s, "")
	}
}

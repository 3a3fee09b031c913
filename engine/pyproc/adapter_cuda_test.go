package pyproc

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/lora"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestAdapterGraphsCUDA (MLXSERVING_TEST_DEVICE=cuda only): in bfloat16,
// steps mixing two adapters and the base decode on CUDA graphs captured
// with the delta (and lookahead chains of them), and their greedy tokens
// start as the eager path's (an engine without graphs) and the merged
// checkpoint's. bf16 roundings differ between the paths, so only the
// first tokens are compared. Both deltas: the segmented kernels (the
// default) and the dense one (Tuning.DenseLoRA, also what serves where
// the kernels' load-time check fails).
func TestAdapterGraphsCUDA(t *testing.T) {
	if os.Getenv("MLXSERVING_TEST_DEVICE") != "cuda" {
		t.Skip("CUDA only (MLXSERVING_TEST_DEVICE=cuda)")
	}
	for _, d := range loraDeltas {
		t.Run(d.name, func(t *testing.T) { adapterGraphs(t, d.tuning) })
	}
}

// loraDeltas are the two ways the torch engine computes adapter deltas on
// CUDA.
var loraDeltas = []struct {
	name   string
	tuning Tuning
}{{"segmented", Tuning{}}, {"dense", Tuning{DenseLoRA: true}}}

func adapterGraphs(t *testing.T, tuning Tuning) {
	const n, same = 16, 6
	c, load := xyCase(t)
	adapters := []string{"x", "", "y", "x"}
	run := func(e *Engine) ([][]int32, map[string]any) {
		m := load(e)
		ctx := context.Background()
		prompts := make([][]int32, len(adapters))
		fed := make([]int, len(adapters))
		for i, a := range adapters {
			prompts[i] = prompt(20+i, 9+5*i)
			r, err := m.OpenAdapter(ctx, engine.SeqID(i), prompts[i], "", a)
			if err != nil {
				t.Fatal(err)
			}
			fed[i] = r
		}
		// Staggered starts, prompts in chunks of 4: steps mix chunks with
		// decodes (split steps: decodes on a graph, chunks packed).
		out := stepStaggered(t, m, prompts, fed, n, 4)
		st := workerStats(t, e, m)
		for i := range adapters {
			m.Free(engine.SeqID(i), "")
		}
		return out, st
	}
	got, st := run(newEngine(t, WithDType("bfloat16"), WithTuning(tuning)))
	if g, _ := st["lora_graphs"].(float64); g == 0 {
		t.Errorf("no decode graph was captured with the delta (stats %v): adapter steps ran eagerly (see the worker's log)", st)
	}
	eager, _ := run(newEngine(t, WithDType("bfloat16"), WithCUDAGraphs(false), WithTuning(tuning)))
	for i := range adapters {
		if d := firstDiffAt(got[i], eager[i]); d < same {
			t.Errorf("seq %d (adapter %q): graphs %v, eager %v: differ at %d", i, adapters[i], got[i], eager[i], d)
		}
	}
	e := newEngine(t, WithDType("bfloat16"))
	ref := loadSpec(t, e, engine.ModelSpec{ID: "merged", Path: c.merged})
	for i, a := range adapters {
		if a != "x" {
			continue
		}
		want := generate(t, ref, engine.SeqID(100+i), prompt(20+i, 9+5*i), n)
		if d := firstDiffAt(got[i], want); d < same {
			t.Errorf("seq %d: adapter x %v, merged %v: differ at %d", i, got[i], want, d)
		}
	}
}

// TestAdapterPrefillGraphsCUDA (MLXSERVING_TEST_DEVICE=cuda only): in
// bfloat16, prompt steps whose chunks run two adapters and the base
// (three prompts in one step, then a fourth beside their decodes: a split
// step) replay the prompt-step graphs captured with the delta (the
// worker's stats list their token buckets), and sample what the same
// steps sample with the prompt-step graphs off (the decode graphs on in
// both): the first tokens alike, the prompts' first logprobs within bf16
// rounding (the graphs run the projections and the delta on the
// bucket's padded rows). Both deltas, as TestAdapterGraphsCUDA: with the
// segmented kernels the eager steps run them too; with the dense delta
// the eager steps run a product per adapter.
func TestAdapterPrefillGraphsCUDA(t *testing.T) {
	if os.Getenv("MLXSERVING_TEST_DEVICE") != "cuda" {
		t.Skip("CUDA only (MLXSERVING_TEST_DEVICE=cuda)")
	}
	for _, d := range loraDeltas {
		t.Run(d.name, func(t *testing.T) { adapterPrefillGraphs(t, d.tuning) })
	}
}

func adapterPrefillGraphs(t *testing.T, tuning Tuning) {
	const steps, same = 8, 4
	_, load := xyCase(t)
	adapters := []string{"x", "", "y", "x"}
	lens := []int{37, 150, 300, 90}
	run := func(e *Engine) ([][]int32, []float64, map[string]any) {
		m := load(e)
		ctx := context.Background()
		inputs := make([]engine.StepInput, len(adapters))
		for i, a := range adapters {
			p := prompt(30+i, lens[i])
			r, err := m.OpenAdapter(ctx, engine.SeqID(i), p, "", a)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Free(engine.SeqID(i), "")
			inputs[i] = engine.StepInput{Seq: engine.SeqID(i), Tokens: p[r:], Sample: true, Params: &engine.SamplingParams{Logprobs: true}}
		}
		toks := make([][]int32, len(adapters))
		var first []float64
		for step := range steps {
			batch := inputs[:3]
			if step > 0 { // the last prompt joins beside the others' decodes
				batch = inputs
			}
			outs, err := m.Step(ctx, batch)
			if err != nil {
				t.Fatal(err)
			}
			for i, o := range outs {
				if len(toks[i]) == 0 {
					first = append(first, float64(o.Logprob))
				}
				toks[i] = append(toks[i], o.Token)
				inputs[i].Tokens = []int32{o.Token}
			}
		}
		return toks, first, workerStats(t, e, m)
	}
	got, lg, st := run(newEngine(t, WithDType("bfloat16"), WithTuning(tuning)))
	if b := fmt.Sprint(st["prefill_lora_graphs"]); b == "[]" || b == "<nil>" {
		t.Errorf("no prompt-step graph was captured with the delta (stats %v): prompt steps with adapters ran eagerly (see the worker's log)", st)
	}
	noGraphs := tuning
	noGraphs.NoPrefillGraphs = true
	eager, le, st := run(newEngine(t, WithDType("bfloat16"), WithTuning(noGraphs)))
	if b := fmt.Sprint(st["prefill_lora_graphs"]); b != "[]" {
		t.Errorf("prompt-step graphs off: stats list buckets %v captured with the delta", b)
	}
	for i, a := range adapters {
		if d := firstDiffAt(got[i], eager[i]); d < same {
			t.Errorf("seq %d (adapter %q): prompt graphs %v, eager %v: differ at %d", i, a, got[i], eager[i], d)
		}
		if d := lg[i] - le[i]; d > 0.03 || d < -0.03 {
			t.Errorf("seq %d (adapter %q): first token's logprob %.5f with prompt graphs, %.5f eager", i, a, lg[i], le[i])
		}
	}
}

// xyCase writes, for the CUDA adapter tests, a small base, adapter x
// (rank 16, with its merged checkpoint) and adapter y (rank 8); load
// loads the base into an engine with two adapter slots and adds x and y.
func xyCase(t *testing.T) (c loraCase, load func(e *Engine) *Model) {
	t.Helper()
	base := testmodel.Tiny()
	base.Hidden, base.Intermediate = 128, 256
	c = writeLoRA(t, base, testmodel.Adapter{Rank: 16, Seed: 71})
	dy := t.TempDir()
	if err := testmodel.WriteAdapter(dy, base, testmodel.Adapter{Rank: 8, Seed: 72}); err != nil {
		t.Fatal(err)
	}
	return c, func(e *Engine) *Model {
		m := loadSpec(t, e, engine.ModelSpec{ID: "base", Path: c.base, AdapterSlots: 2, MaxAdapterRank: 16})
		addAdapter(t, m, "x", c.adapter)
		addAdapter(t, m, "y", dy)
		return m
	}
}

// workerStats is the first worker's stats op reply for m.
func workerStats(t *testing.T, e *Engine, m *Model) map[string]any {
	t.Helper()
	return workerStatsOf(t, e, m, 0)
}

// workerStatsOf is worker i's stats op reply for m.
func workerStatsOf(t *testing.T, e *Engine, m *Model, i int) map[string]any {
	t.Helper()
	ctx := context.Background()
	p, err := e.slots[i].current(ctx, e.closing)
	if err != nil {
		t.Fatal(err)
	}
	r, err := p.call(ctx, m.spec.ID, request("stats", nil))
	if err != nil {
		t.Fatal(err)
	}
	st, _ := r.Stats[m.handle].(map[string]any)
	return st
}

func firstDiffAt(a, b []int32) int {
	for i := range a {
		if i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// TestAdapterGraphsEmulated runs testdata/lora_graphs_test.py: the LoRA
// graph paths (the decode graphs captured with the delta, split steps,
// the dense delta, the prompt-step graphs with the delta, piecewise and of
// whole steps, on stand-ins of the CUDA kernels) on the CPU, each capture's step run again at every
// replay, against the eager path: the same tokens (and, for the prompt
// steps, logprobs); captures made to fail leave their steps eager with
// the same tokens; under tensor parallel 2 (gloo) each rank's graphs and
// eager steps decode what one rank decodes.
func TestAdapterGraphsEmulated(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	if err := testmodel.Write(base, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	var ads []map[string]any
	for i, ad := range []testmodel.Adapter{{Rank: 8, Seed: 81}, {Rank: 4, Seed: 82, MLX: true}} {
		d := filepath.Join(dir, fmt.Sprint("a", i))
		if err := testmodel.WriteAdapter(d, testmodel.Tiny(), ad); err != nil {
			t.Fatal(err)
		}
		a, err := lora.Read(d)
		if err != nil {
			t.Fatal(err)
		}
		load, err := loadObject(a)
		if err != nil {
			t.Fatal(err)
		}
		ads = append(ads, map[string]any{"name": fmt.Sprint("a", i, "#1"), "load": load})
	}
	js, err := json.Marshal(ads)
	if err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(dir, "adapters.json")
	if err := os.WriteFile(spec, js, 0o644); err != nil {
		t.Fatal(err)
	}
	runPyCheck(t, "testdata/lora_graphs_test.py", "runtime", base, spec)
}

// TestAdapterKernelsCUDA (MLXSERVING_TEST_DEVICE=cuda only) runs
// testdata/lora_kernels_cuda.py: the segmented LoRA kernels
// (lora_triton.py) against the delta computed slot by slot in float32,
// over llama-, Phi-3- and tiny-shaped projections, one row to 2,048 of
// many slots and the base, eager and replayed from CUDA graphs.
func TestAdapterKernelsCUDA(t *testing.T) {
	if os.Getenv("MLXSERVING_TEST_DEVICE") != "cuda" {
		t.Skip("CUDA only (MLXSERVING_TEST_DEVICE=cuda)")
	}
	runPyCheck(t, "testdata/lora_kernels_cuda.py", "runtime")
}

// TestLoRAKernelVariants runs testdata/lora_variants_test.py on the CPU:
// with Triton replaced by a recorder of each launch's compile key, the
// segmented LoRA kernels' lora_triton.variants tells two row counts apart
// exactly when their launches would compile different kernels, from one
// row to past where the variants stop changing (lora.Slots.warm compiles
// each variant at the first adapter load, so no step waits for Triton).
func TestLoRAKernelVariants(t *testing.T) {
	runPyCheck(t, "testdata/lora_variants_test.py", "runtime")
}

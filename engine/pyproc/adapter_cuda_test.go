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
// first tokens are compared.
func TestAdapterGraphsCUDA(t *testing.T) {
	if os.Getenv("MLXSERVING_TEST_DEVICE") != "cuda" {
		t.Skip("CUDA only (MLXSERVING_TEST_DEVICE=cuda)")
	}
	const n, same = 16, 6
	base := testmodel.Tiny()
	base.Hidden, base.Intermediate = 128, 256
	c := writeLoRA(t, base, testmodel.Adapter{Rank: 16, Seed: 71})
	dy := t.TempDir()
	if err := testmodel.WriteAdapter(dy, base, testmodel.Adapter{Rank: 8, Seed: 72}); err != nil {
		t.Fatal(err)
	}
	adapters := []string{"x", "", "y", "x"}
	run := func(e *Engine) ([][]int32, map[string]any) {
		m := loadSpec(t, e, engine.ModelSpec{ID: "base", Path: c.base, AdapterSlots: 2, MaxAdapterRank: 16})
		addAdapter(t, m, "x", c.adapter)
		addAdapter(t, m, "y", dy)
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
	got, st := run(newEngine(t, WithDType("bfloat16")))
	if g, _ := st["lora_graphs"].(float64); g == 0 {
		t.Errorf("no decode graph was captured with the delta (stats %v): adapter steps ran eagerly (see the worker's log)", st)
	}
	eager, _ := run(newEngine(t, WithDType("bfloat16"), WithCUDAGraphs(false)))
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

// workerStats is the first worker's stats op reply for m.
func workerStats(t *testing.T, e *Engine, m *Model) map[string]any {
	t.Helper()
	ctx := context.Background()
	p, err := e.slots[0].current(ctx, e.closing)
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
// decode-graph paths (the graphs captured with the delta, split steps,
// the dense delta) on the CPU, each capture's step run again at every
// replay, against the eager path; captures made to fail leave their
// steps eager with the same tokens; under tensor parallel 2 (gloo) each
// rank's graphs and eager steps decode what one rank decodes.
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

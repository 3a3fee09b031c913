package pyproc

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// tpAdapterScript adds two adapters to m (x: PEFT's layout over every
// projection; y: mlx-lm's over v, o and down, the row-parallel ones) and
// runs them beside the base in the same steps, prompts fed in chunks
// beside decodes; it returns every sequence's greedy tokens. x and the
// base run one prompt, so their tokens must differ.
func tpAdapterScript(t *testing.T, m *Model, x, y string) [][]int32 {
	t.Helper()
	addAdapter(t, m, "x", x)
	addAdapter(t, m, "y", y)
	prompts := [][]int32{prompt(1, 19), prompt(1, 19), prompt(3, 33), prompt(4, 12), prompt(5, 26)}
	got := stepAdapters(t, m, prompts, []string{"x", "", "y", "x", ""}, 8)
	if slices.Equal(got[0], got[1]) {
		t.Fatalf("adapter x decodes the base's tokens %v", got[1])
	}
	return got
}

// TestTensorParallelAdapters serves two adapters and the base in the same
// steps under tensor parallel 2 (each rank its share of every slot) and
// wants tensor parallel 1's greedy tokens (float32), for each family the
// split covers, with the delta planned per adapter and dense (as the
// CUDA decode graphs compute it). Each rank's slots hold a share: the
// model's adapter bytes are more than one rank's.
func TestTensorParallelAdapters(t *testing.T) {
	python(t)
	needGPUs(t, 2)
	type fixture struct{ base, x, y string }
	fams := map[string]fixture{}
	for _, arch := range []string{"llama", "qwen2", "qwen3", "gemma3_text"} {
		c := testmodel.TinyFamily(arch)
		root := t.TempDir()
		f := fixture{filepath.Join(root, "base"), filepath.Join(root, "x"), filepath.Join(root, "y")}
		for _, err := range []error{
			testmodel.Write(f.base, c),
			testmodel.WriteAdapter(f.x, c, testmodel.Adapter{Rank: 8, Seed: 41}),
			testmodel.WriteAdapter(f.y, c, testmodel.Adapter{Rank: 4, Seed: 42, MLX: true,
				Targets: []string{"self_attn.v_proj", "self_attn.o_proj", "mlp.down_proj"}}),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
		fams[arch] = f
	}
	for _, tc := range []struct {
		name string
		tu   Tuning
	}{{"plan", Tuning{}}, {"dense", Tuning{DenseLoRA: true}}} {
		t.Run(tc.name, func(t *testing.T) {
			want, bytes := map[string][][]int32{}, map[string]int64{}
			one := newEngine(t, WithTuning(tc.tu))
			for arch, f := range fams {
				m := loadSpec(t, one, engine.ModelSpec{ID: arch, Path: f.base})
				want[arch] = tpAdapterScript(t, m, f.x, f.y)
				bytes[arch] = m.Info().AdapterBytes
			}
			_ = one.Close()
			e := newEngine(t, WithTensorParallel(2), WithTuning(tc.tu))
			for arch, f := range fams {
				m := loadSpec(t, e, engine.ModelSpec{ID: arch, Path: f.base})
				info := m.Info()
				if info.AdapterSlots != engine.DefaultAdapterSlots || info.AdapterBytes <= bytes[arch] || info.AdapterBytes >= 2*bytes[arch] {
					t.Errorf("%s under tp 2: %d adapter slots (want %d), %d bytes of slots against %d on one rank",
						arch, info.AdapterSlots, engine.DefaultAdapterSlots, info.AdapterBytes, bytes[arch])
				}
				if got := tpAdapterScript(t, m, f.x, f.y); !slices.EqualFunc(got, want[arch], slices.Equal) {
					t.Errorf("%s: tensor parallel 2 gave\n%v\nwant (tp 1)\n%v", arch, got, want[arch])
				}
			}
		})
	}
}

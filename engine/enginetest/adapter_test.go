package enginetest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/mlxserving/mlxserving/testmodel"
)

// TestSimAdapters runs the adapter checks on the simulated engine: its
// adapters are real adapter files (PEFT and mlx-lm layouts), read and
// checked with the engines' reader; no merged checkpoint applies.
func TestSimAdapters(t *testing.T) {
	sim, err := NewSim(WithVocabSize(500), WithContextLength(512), WithMaxBatch(8), WithBlockSize(16))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	base := testmodel.Tiny()
	var cases []AdapterCase
	for i, a := range []testmodel.Adapter{{Rank: 4, Seed: 1}, {Rank: 8, Seed: 2, MLX: true}} {
		dir := filepath.Join(t.TempDir(), string(rune('a'+i)))
		if err := testmodel.WriteAdapter(dir, base, a); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, AdapterCase{Dir: dir})
	}
	tooHigh := t.TempDir()
	if err := testmodel.WriteAdapter(tooHigh, base, testmodel.Adapter{Rank: 128}); err != nil {
		t.Fatal(err)
	}
	broken := t.TempDir()
	if err := testmodel.WriteAdapter(broken, base, testmodel.Adapter{}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(broken, "adapter_config.json"), []byte(`{"peft_type": "LORA", "r": 0}`), 0o644); err != nil {
		t.Fatal(err)
	}
	RunAdapters(t, sim, "", cases, []string{tooHigh, broken})
	if st := sim.Stats(); st.OpenSequences != 0 || st.KVTokens != 0 || st.Models != 0 || st.AdapterLoads < 4 {
		t.Errorf("after the suite: %+v; want no open sequences, KV or models, and the one-slot model's reloads", st)
	}
}

//go:build mlx

package mlx

import (
	"context"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/pyproc"
	"github.com/mlxserving/mlxserving/testmodel"
)

// torchEngine starts the Python engine's torch backend on the CPU, the
// reference for greedy tokens. Without MLXSERVING_PYTHON the test skips,
// unless CI is set.
func torchEngine(t testing.TB) *pyproc.Engine {
	t.Helper()
	py := os.Getenv("MLXSERVING_PYTHON")
	if py == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("MLXSERVING_PYTHON is not set: source scripts/setup.d/30-python.sh")
		}
		t.Skip("MLXSERVING_PYTHON is not set (scripts/setup.d/30-python.sh installs python3-torch)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := pyproc.New(ctx, pyproc.WithPython(py), pyproc.WithBackend("torch"), pyproc.WithDevice("cpu"),
		pyproc.WithCacheDir(t.TempDir()), pyproc.WithThreads(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// TestGreedyMatchesTorch compares greedy tokens and their log-probabilities
// with the Python engine's torch backend on the same float32 checkpoints:
// the tiny Llama, GQA Qwen2 with biases, tied Mistral, and llama3 rope
// scaling.
func TestGreedyMatchesTorch(t *testing.T) {
	py := torchEngine(t)
	e := newEngine(t)
	cfgs := map[string]func(*testmodel.Config){
		"llama": nil,
		"qwen2": func(c *testmodel.Config) { c.Arch = "qwen2" },
		"mistral-tied": func(c *testmodel.Config) {
			c.Arch, c.TieEmbeddings = "mistral", true
		},
		"llama3-rope": func(c *testmodel.Config) {
			c.RopeScaling = &testmodel.RopeScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 32}
		},
	}
	ctx := context.Background()
	params := &engine.SamplingParams{Logprobs: true}
	for name, edit := range cfgs {
		dir := tinyDir(t, edit)
		mine := load(t, e, dir)
		ref, err := py.Load(ctx, engine.ModelSpec{ID: name, Path: dir})
		if err != nil {
			t.Fatal(err)
		}
		var worst float64
		for i, p := range prompts() {
			want, wantLP := generate(t, ref, engine.SeqID(i), p, 16, 100, params)
			got, gotLP := generate(t, mine, engine.SeqID(i), p, 16, 100, params)
			if !slices.Equal(got, want) {
				t.Errorf("%s prompt %d: mlx %v, torch %v", name, i, got, want)
			}
			for j := range min(len(gotLP), len(wantLP)) {
				worst = math.Max(worst, math.Abs(float64(gotLP[j]-wantLP[j])))
			}
		}
		t.Logf("%s: 4 prompts x 16 greedy tokens equal; max |logprob difference| %.2e", name, worst)
		if worst > 1e-3 {
			t.Errorf("%s: log-probabilities differ by up to %v", name, worst)
		}
		ref.Close()
	}
}

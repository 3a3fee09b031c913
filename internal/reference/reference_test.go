package reference

import (
	"context"
	"math"
	"os"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestGreedy runs the reference on every family's tiny checkpoint: a run
// per prompt, n tokens each, log-probabilities at most 0 and gaps at
// least 0.
func TestGreedy(t *testing.T) {
	py := os.Getenv("MLXSERVING_PYTHON")
	if py == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("MLXSERVING_PYTHON is not set: source scripts/setup.d/30-python.sh")
		}
		t.Skip("MLXSERVING_PYTHON is not set (scripts/setup.d/30-python.sh installs python3-torch)")
	}
	for _, arch := range testmodel.TorchArchs() {
		dir := t.TempDir()
		if err := testmodel.Write(dir, testmodel.TinyFamily(arch)); err != nil {
			t.Fatal(err)
		}
		runs, err := Greedy(context.Background(), py, dir, [][]int32{{1, 2, 3}, {7}}, 3)
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		for _, r := range runs {
			if len(r.Tokens) != 3 || len(r.Logprobs) != 3 || len(r.Gaps) != 3 {
				t.Fatalf("%s: run %+v", arch, r)
			}
			for i := range r.Tokens {
				if r.Logprobs[i] > 0 || r.Gaps[i] < 0 || r.Tokens[i] < 0 {
					t.Errorf("%s: step %d: token %d, logprob %v, gap %v", arch, i, r.Tokens[i], r.Logprobs[i], r.Gaps[i])
				}
			}
		}
	}
	if _, err := Greedy(context.Background(), py, t.TempDir(), [][]int32{{1}}, 1); err == nil {
		t.Error("a directory without a checkpoint: no error")
	}
}

// TestEmbed runs the reference's pooled vectors on both encoders and a
// decoder: a vector of the hidden size per input; an encoder's first
// token reads the tokens after it (bidirectional), a decoder's does not
// (causal); mean, cls and lasttoken differ.
func TestEmbed(t *testing.T) {
	py := os.Getenv("MLXSERVING_PYTHON")
	if py == "" {
		t.Skip("MLXSERVING_PYTHON is not set")
	}
	ctx := context.Background()
	long := make([]int32, 40)
	for i := range long {
		long[i] = int32(7 + 5*i)
	}
	for _, arch := range []string{"bert", "modernbert", "qwen3"} {
		dir := t.TempDir()
		c := testmodel.TinyFamily(arch)
		if err := testmodel.Write(dir, c); err != nil {
			t.Fatal(err)
		}
		inputs := [][]int32{long[:3], long}
		got := map[engine.Pooling][][]float64{}
		for _, pool := range []engine.Pooling{engine.PoolMean, engine.PoolCLS, engine.PoolLast} {
			vecs, err := Embed(ctx, py, dir, inputs, pool)
			if err != nil {
				t.Fatalf("%s %v: %v", arch, pool, err)
			}
			for _, v := range vecs {
				if len(v) != c.Hidden {
					t.Fatalf("%s: vector of %d, want %d", arch, len(v), c.Hidden)
				}
			}
			got[pool] = vecs
		}
		firstMoved := maxDiff(got[engine.PoolCLS][0], got[engine.PoolCLS][1])
		if encoder := testmodel.IsEncoder(arch); encoder != (firstMoved > 1e-6) {
			t.Errorf("%s: the first token's state moved by %g when tokens followed it (encoder %v)", arch, firstMoved, encoder)
		}
		if maxDiff(got[engine.PoolMean][1], got[engine.PoolCLS][1]) < 1e-3 || maxDiff(got[engine.PoolLast][1], got[engine.PoolCLS][1]) < 1e-3 {
			t.Errorf("%s: poolings agree", arch)
		}
	}
	if _, err := Embed(ctx, py, t.TempDir(), [][]int32{{1}}, engine.PoolNone); err == nil {
		t.Error("PoolNone: no error")
	}
}

func maxDiff(a, b []float64) float64 {
	m := 0.0
	for i := range a {
		m = max(m, math.Abs(a[i]-b[i]))
	}
	return m
}

// TestQuantized runs the reference on testmodel.TinyQuant in every
// quantized layout, which it dequantizes: the first step's largest
// log-probability (continuous in the logits, unlike the greedy token of a
// random model's near-flat distribution) is near the float model's, within
// what the quantization moves it here (a tenth), and not equal to it.
func TestQuantized(t *testing.T) {
	py := os.Getenv("MLXSERVING_PYTHON")
	if py == "" {
		t.Skip("MLXSERVING_PYTHON is not set")
	}
	prompts := [][]int32{{1, 2, 3}, {7, 100, 42, 9}, {300}}
	run := func(q string) []Run {
		cfg := testmodel.TinyQuant()
		cfg.Quant = q
		dir := t.TempDir()
		if err := testmodel.Write(dir, cfg); err != nil {
			t.Fatal(err)
		}
		runs, err := Greedy(context.Background(), py, dir, prompts, 1)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return runs
	}
	want := run("")
	for _, q := range testmodel.AllQuants() {
		for i, r := range run(q) {
			d := math.Abs(r.Logprobs[0] - want[i].Logprobs[0])
			if d == 0 || d > 0.3 {
				t.Errorf("%s: prompt %d: largest log-probability %.4f, float model %.4f", q, i, r.Logprobs[0], want[i].Logprobs[0])
			}
		}
	}
}

// TestDequantizedWeights: the weights the reference runs on a quantized
// checkpoint are the float model's within the layout's rounding (at most
// 7% of the largest magnitude in each 128-wide group of a row; see
// testmodel's TestQuantLayouts; of the row's, where act order scatters
// the groups) and not equal to them.
func TestDequantizedWeights(t *testing.T) {
	py := os.Getenv("MLXSERVING_PYTHON")
	if py == "" {
		t.Skip("MLXSERVING_PYTHON is not set")
	}
	names := []string{"model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.down_proj.weight", "model.norm.weight"}
	weights := func(q string) map[string][]float64 {
		cfg := testmodel.TinyQuant()
		cfg.Quant = q
		dir := t.TempDir()
		if err := testmodel.Write(dir, cfg); err != nil {
			t.Fatal(err)
		}
		w, err := Weights(context.Background(), py, dir, names)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	want := weights("")
	in := map[string]int{names[0]: 256, names[1]: 512, names[2]: 256}
	for _, q := range testmodel.AllQuants() {
		got := weights(q)
		for _, n := range names {
			g, w := got[n], want[n]
			if len(g) != len(w) {
				t.Fatalf("%s %s: %d values, want %d", q, n, len(g), len(w))
			}
			span := min(128, in[n])
			if q == testmodel.QuantGPTQActOrder || q == testmodel.QuantW4A16ActOrder {
				span = in[n] // act order scatters a group over the row
			}
			worst := 0.0
			for i := range g {
				lo := i / span * span
				amax := 0.0
				for _, v := range w[lo : lo+span] {
					amax = math.Max(amax, math.Abs(v))
				}
				worst = math.Max(worst, math.Abs(g[i]-w[i])/amax)
			}
			if quantized := n != names[2]; worst > 0.07 || (worst == 0) == quantized {
				t.Errorf("%s %s: worst error %.4f of the group's largest magnitude", q, n, worst)
			}
		}
	}
}

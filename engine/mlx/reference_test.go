//go:build mlx

package mlx

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/engine/pyproc"
	"github.com/mlxserving/mlxserving/internal/reference"
	"github.com/mlxserving/mlxserving/testmodel"
)

// torchEngine starts the Python engine's torch backend on the CPU, the
// reference for greedy tokens. Without MLXSERVING_PYTHON the test skips,
// unless CI is set.
func torchEngine(t testing.TB) *pyproc.Engine {
	t.Helper()
	py := python(t)
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

// python is the interpreter with torch, MLXSERVING_PYTHON. Without it
// the test skips, unless CI is set.
func python(t testing.TB) string {
	t.Helper()
	py := os.Getenv("MLXSERVING_PYTHON")
	if py == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("MLXSERVING_PYTHON is not set: source scripts/setup.d/30-python.sh")
		}
		t.Skip("MLXSERVING_PYTHON is not set (scripts/setup.d/30-python.sh installs python3-torch)")
	}
	return py
}

// TestGreedyMatchesTorch compares greedy tokens and their log-probabilities
// with the Python engine's torch backend on the same float32 checkpoints:
// every family testmodel writes (TinyFamily), tied Mistral and llama3 rope
// scaling, prompts within and past the sliding windows.
func TestGreedyMatchesTorch(t *testing.T) {
	py := torchEngine(t)
	e := newEngine(t)
	cfgs := map[string]testmodel.Config{}
	for _, arch := range testmodel.Archs() { // every family, sliding windows of 16
		cfgs[arch] = testmodel.TinyFamily(arch)
	}
	tied := testmodel.TinyFamily("mistral")
	tied.TieEmbeddings = true
	cfgs["mistral-tied"] = tied
	scaled := testmodel.Tiny()
	scaled.RopeScaling = &testmodel.RopeScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 32}
	cfgs["llama3-rope"] = scaled
	long := make([]int32, 40) // past the windows: sliding layers drop keys
	for i := range long {
		long[i] = int32(1 + (i*53)%300)
	}
	ctx := context.Background()
	params := &engine.SamplingParams{Logprobs: true}
	for name, cfg := range cfgs {
		dir := t.TempDir()
		if err := testmodel.Write(dir, cfg); err != nil {
			t.Fatal(err)
		}
		mine := load(t, e, dir)
		ref, err := py.Load(ctx, engine.ModelSpec{ID: name, Path: dir})
		if err != nil {
			t.Fatal(err)
		}
		var worst float64
		for i, p := range append(prompts(), long) {
			want, wantLP := generate(t, ref, engine.SeqID(i), p, 16, 100, params)
			got, gotLP := generate(t, mine, engine.SeqID(i), p, 16, 100, params)
			if !slices.Equal(got, want) {
				t.Errorf("%s prompt %d: mlx %v, torch %v", name, i, got, want)
			}
			for j := range min(len(gotLP), len(wantLP)) {
				worst = math.Max(worst, math.Abs(float64(gotLP[j]-wantLP[j])))
			}
		}
		t.Logf("%s: 5 prompts x 16 greedy tokens equal; max |logprob difference| %.2e", name, worst)
		if worst > 1e-3 {
			t.Errorf("%s: log-probabilities differ by up to %v", name, worst)
		}
		ref.Close()
		mine.Close()
	}
}

// TestMatchesReference runs every family testmodel writes (TinyFamily:
// sliding windows of 16, experts, longrope, Gemma's norms and caps)
// against internal/reference/reference.py, a float64 forward pass without
// caches written apart from the engines: greedy tokens must agree
// wherever the reference's top two are not a near tie, log-probabilities
// within 1e-4. The 70-token prompt runs whole and in chunks of 9, so
// sliding layers attend through the window in prefill groups, in
// prefill chunks that start past it and in decode steps; phi3 adds a
// 150-token prompt past longrope's original 128 positions, fed whole
// only: transformers rotates a forward call's tokens with the long
// factors when the call reaches past the original length, so a prompt
// that crosses it in chunks rotates its first chunks short, unlike the
// reference's one pass (planLongRoPE). A tied Gemma 3 with head_dim 256
// follows: on CUDA its q/k norms take rmsNormOps (rmsNormMixesRows);
// with MLX 0.31's CUDA norm emulated, this case's log-probabilities are
// off by up to 0.6 and its tokens diverge.
func TestMatchesReference(t *testing.T) {
	py := python(t)
	e := newEngine(t)
	for _, arch := range testmodel.Archs() {
		t.Run(arch, func(t *testing.T) { matchReference(t, py, e, testmodel.TinyFamily(arch)) })
	}
	// Gemma 3 as published: tied output head (the scaled embedding's
	// rows, unscaled), head_dim 256 with one key/value head, so the
	// per-head q/k norms run on rows of 256 (on CUDA, rmsNormMixesRows).
	t.Run("gemma3_text-tied-head256", func(t *testing.T) {
		c := testmodel.TinyFamily("gemma3_text")
		c.HeadSize, c.KVHeads, c.TieEmbeddings = 256, 1, true
		matchReference(t, py, e, c)
	})
	// gpt-oss as OpenAI publishes it: experts in MXFP4, kept so
	// (gather_qmm in mode mxfp4); the reference dequantizes them.
	t.Run("gpt_oss-mxfp4", func(t *testing.T) {
		c := testmodel.TinyFamily("gpt_oss")
		c.Quant = testmodel.QuantMXFP4
		matchReference(t, py, e, c)
	})
	// YaRN past its original context (the 70-token prompt).
	for name, c := range enginetest.YarnConfigs() {
		t.Run(name, func(t *testing.T) { matchReference(t, py, e, c) })
	}
}

// matchReference is TestMatchesReference for the checkpoint of cfg.
func matchReference(t *testing.T, py string, e *Engine, cfg testmodel.Config) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, cfg); err != nil {
		t.Fatal(err)
	}
	matchReferenceDir(t, py, e, dir, cfg.Arch)
}

// matchReferenceDir is matchReference on the checkpoint in dir, of
// family arch.
func matchReferenceDir(t *testing.T, py string, e *Engine, dir, arch string) {
	const n = 6
	prompts := [][]int32{refPrompt(1, 5), refPrompt(2, 70), refPrompt(3, 1)}
	var long []int32
	if arch == "phi3" {
		long = refPrompt(4, 150)
	}
	all := prompts
	if long != nil {
		all = append(slices.Clone(prompts), long)
	}
	ref := runReference(t, py, dir, all, n)
	m := load(t, e, dir)
	params := &engine.SamplingParams{Logprobs: true}
	if long != nil {
		toks, lps := generate(t, m, 9, long, n, len(long), params)
		checkReference(t, "long prompt", toks, lps, ref[len(prompts)])
	}
	for i, p := range prompts {
		for _, chunk := range []int{200, 9} {
			toks, lps := generate(t, m, engine.SeqID(i), p, n, chunk, params)
			checkReference(t, fmt.Sprintf("prompt %d (chunks of %d)", i, chunk), toks, lps, ref[i])
		}
	}
	// All prompts at once, mixing prefill and decode.
	for i, toks := range generateBatch(t, m, prompts, n, nil) {
		checkReference(t, fmt.Sprintf("prompt %d (batched)", i), toks, nil, ref[i])
	}
}

func checkReference(t *testing.T, what string, toks []int32, lps []float32, ref reference.Run) {
	t.Helper()
	for k := range toks {
		if toks[k] != ref.Tokens[k] {
			if ref.Gaps[k] < 1e-3 {
				return // a near tie: either token is right; the rest diverges
			}
			t.Errorf("%s token %d: %d, reference %d (gap %.4f); got %v, reference %v", what, k, toks[k], ref.Tokens[k], ref.Gaps[k], toks, ref.Tokens)
			return
		}
		if k < len(lps) {
			if d := math.Abs(float64(lps[k]) - ref.Logprobs[k]); d > 1e-4 {
				t.Errorf("%s token %d: logprob %v, reference %v", what, k, lps[k], ref.Logprobs[k])
			}
		}
	}
}

// refPrompt is n token ids below the tiny vocabulary, varying with seed.
func refPrompt(seed, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((seed*131 + i*37 + 11) % 379)
	}
	return p
}

// runReference runs the reference (internal/reference) on the checkpoint
// in dir: n greedy tokens after each prompt.
func runReference(t *testing.T, py, dir string, prompts [][]int32, n int) []reference.Run {
	t.Helper()
	runs, err := reference.Greedy(context.Background(), py, dir, prompts, n)
	if err != nil {
		t.Fatal(err)
	}
	return runs
}

package pyproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// tpFamilies are the families the tensor-parallel tests split: Llama,
// Qwen2 (q, k and v biases), Qwen3 (per-head QK norm) and Gemma 3
// (sandwich norms, sliding layers, GELU), with the vocabulary cut unevenly
// where padded shares matter (tp 4).
func tpFamilies(t *testing.T, ranks int) map[string]string {
	t.Helper()
	dirs := map[string]string{}
	for _, arch := range []string{"llama", "qwen2", "qwen3", "gemma3_text"} {
		c := testmodel.TinyFamily(arch)
		c.KVHeads = ranks // every rank one KV head at least
		c.Vocab = 386     // not a multiple of 4: the last share is padded
		dir := t.TempDir()
		if err := testmodel.Write(dir, c); err != nil {
			t.Fatal(err)
		}
		dirs[arch] = dir
	}
	return dirs
}

// tpScript runs one workload on m and returns every token it sampled and
// every prefix reuse: two prompts fed in chunks (a step that samples
// nothing, then chunks beside decodes in batched steps), a seeded
// temperature sequence, a sequence that resumes a saved prefix and one
// that reuses the prefix cache.
func tpScript(t *testing.T, m *Model) []int32 {
	t.Helper()
	ctx := context.Background()
	pa, pb := prompt(1, 40), prompt(2, 23)
	open := func(seq engine.SeqID, p []int32, key string) int {
		r, err := m.Open(ctx, seq, p, key)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	step := func(in ...engine.StepInput) []int32 {
		o, err := m.Step(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		var toks []int32
		for _, x := range o {
			toks = append(toks, x.Token)
		}
		return toks
	}
	hot := &engine.SamplingParams{Temperature: 0.9, Seed: 7, HasSeed: true}
	open(1, pa, "")
	open(2, pb, "")
	if got := step(engine.StepInput{Seq: 1, Tokens: pa[:8]}); len(got) != 0 { // a step that samples nothing
		t.Fatalf("a step without sampling inputs returned %v", got)
	}
	out := step(engine.StepInput{Seq: 1, Tokens: pa[8:16]}, engine.StepInput{Seq: 2, Tokens: pb, Sample: true, Params: hot})
	b := out[0]
	got := step(engine.StepInput{Seq: 1, Tokens: pa[16:], Sample: true, Params: greedy},
		engine.StepInput{Seq: 2, Tokens: []int32{b}, Sample: true, Params: hot})
	out = append(out, got...)
	genA := []int32{got[0]}
	for range 8 {
		got = step(engine.StepInput{Seq: 1, Tokens: []int32{got[0]}, Sample: true, Params: greedy},
			engine.StepInput{Seq: 2, Tokens: []int32{got[1]}, Sample: true, Params: hot})
		out = append(out, got...)
		genA = append(genA, got[0])
	}
	m.Free(1, "a")
	m.Free(2, "")
	// The saved conversation, extended: its KV is reused.
	next := append(append(slices.Clone(pa), genA...), prompt(3, 5)...)
	r := open(3, next, "a")
	tok := step(engine.StepInput{Seq: 3, Tokens: next[r:], Sample: true, Params: greedy})
	out = append(out, int32(r))
	for range 4 {
		out = append(out, tok...)
		tok = step(engine.StepInput{Seq: 3, Tokens: tok, Sample: true, Params: greedy})
	}
	m.Free(3, "")
	// A fresh prompt sharing pb's full blocks: the prefix cache.
	pc := append(slices.Clone(pb[:20]), prompt(4, 9)...)
	r = open(4, pc, "")
	out = append(out, int32(r))
	tok = step(engine.StepInput{Seq: 4, Tokens: pc[r:], Sample: true, Params: greedy})
	for range 4 {
		out = append(out, tok...)
		tok = step(engine.StepInput{Seq: 4, Tokens: tok, Sample: true, Params: greedy})
	}
	m.Free(4, "")
	return out
}

// TestTensorParallelMatches runs the same workload on tensor parallel 1,
// 2 and 4 (gloo on the CPU, float32) and wants the same tokens, for each
// family the split covers; and with lookahead, where every rank feeds
// itself the tokens it sampled (a rank sampling otherwise would corrupt
// the KV of its heads).
func TestTensorParallelMatches(t *testing.T) {
	python(t)
	for _, c := range []struct{ ranks, ahead int }{{2, 1}, {2, 4}, {4, 1}} {
		ranks := c.ranks
		if ranks == 4 && testing.Short() {
			continue
		}
		t.Run(fmt.Sprintf("tp%d-lookahead%d", ranks, c.ahead), func(t *testing.T) {
			needGPUs(t, ranks)
			dirs := tpFamilies(t, ranks)
			want := map[string][]int32{}
			weights := map[string]int64{}
			one := newEngine(t, WithLookahead(c.ahead))
			for arch, dir := range dirs {
				m := loadID(t, one, arch, dir)
				weights[arch] = m.Info().WeightBytes
				want[arch] = tpScript(t, m)
			}
			_ = one.Close()
			e := newEngine(t, WithTensorParallel(ranks), WithLookahead(c.ahead))
			for arch, dir := range dirs {
				m := loadID(t, e, arch, dir)
				if got := m.Info().TensorParallel; got != ranks {
					t.Errorf("%s: Info().TensorParallel %d, want %d", arch, got, ranks)
				}
				// Every rank holds the embedding whole and a share of the rest.
				if w := m.Info().WeightBytes; w <= weights[arch] || w/int64(ranks) >= weights[arch] {
					t.Errorf("%s: %d weight bytes over %d ranks, against %d on one", arch, w, ranks, weights[arch])
				}
				if got := tpScript(t, m); !slices.Equal(got, want[arch]) {
					t.Errorf("%s: tensor parallel %d gave\n%v\nwant (tp 1)\n%v", arch, ranks, got, want[arch])
				}
			}
		})
	}
}

// TestTensorParallelRefuses loads models the split cannot serve: each
// load fails with an invalid-parameter error and the worker serves the
// next model.
func TestTensorParallelRefuses(t *testing.T) {
	python(t)
	needGPUs(t, 2)
	e := newEngine(t, WithTensorParallel(2))
	odd := testmodel.Tiny()
	odd.Heads, odd.KVHeads, odd.Hidden = 3, 1, 48
	fp8 := testmodel.TinyQuant()
	fp8.Quant = testmodel.QuantFP8Channel
	for _, tc := range []struct {
		name string
		c    testmodel.Config
		why  string
	}{
		{"odd heads", odd, "number of attention heads (3) is not a multiple of 2"},
		{"moe", testmodel.TinyFamily("qwen3_moe"), "mixture-of-experts"},
		{"gpt_oss", testmodel.TinyFamily("gpt_oss"), "mixture-of-experts"},
		{"phi3", testmodel.TinyFamily("phi3"), "fused projections"},
		{"olmo2", testmodel.TinyFamily("olmo2"), "QK norm over the whole projection"},
		{"fp8", fp8, "quantized weights"},
	} {
		dir := t.TempDir()
		if err := testmodel.Write(dir, tc.c); err != nil {
			t.Fatal(err)
		}
		_, err := e.Load(context.Background(), engine.ModelSpec{ID: tc.name, Path: dir})
		if !errors.Is(err, engine.ErrInvalidParam) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("%s under tensor parallel 2: %v, want ErrInvalidParam saying %q", tc.name, err, tc.why)
		}
	}
	m := load(t, e, tiny(t))
	if got := generate(t, m, 1, prompt(1, 9), 3); len(got) != 3 {
		t.Fatalf("after the refusals: %v", got)
	}
}

// TestTensorParallelGPUsOption checks WithGPUs' arithmetic: replicas of
// the tensor-parallel size, each worker its own devices.
func TestTensorParallelGPUsOption(t *testing.T) {
	c := defaults()
	for _, o := range []Option{WithGPUs([]int{0, 1, 2, 3}), WithTensorParallel(2)} {
		if err := o(&c); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.placeGPUs(); err != nil || c.workers != 2 || c.visibleDevices(0) != "0,1" || c.visibleDevices(1) != "2,3" {
		t.Fatalf("4 GPUs at tp 2: %v, %d workers, %q %q", err, c.workers, c.visibleDevices(0), c.visibleDevices(1))
	}
	c.gpus = []int{0, 1, 2}
	if err := c.placeGPUs(); err == nil {
		t.Error("3 GPUs at tp 2: accepted")
	}
	c.gpus, c.workers, c.workersSet = []int{0, 1, 2, 3}, 3, true
	if err := c.placeGPUs(); err == nil {
		t.Error("4 GPUs at tp 2 with 3 workers: accepted")
	}
	for _, o := range []Option{WithGPUs(nil), WithGPUs([]int{1, 1}), WithGPUs([]int{-1}), WithTensorParallel(0)} {
		if err := o(&c); err == nil {
			t.Error("a bad option accepted")
		}
	}
	if d := defaults(); d.visibleDevices(0) != "" || d.tensorParallel() != 1 {
		t.Error("defaults: devices or ranks set")
	}
}

// TestMLXBackendRefusesTorchOptions: tensor parallel, -quantize, an FP8
// KV cache and GPU placement need the torch backend; with the mlx backend
// New refuses them before any worker starts.
func TestMLXBackendRefusesTorchOptions(t *testing.T) {
	for _, o := range []Option{WithTensorParallel(2), WithQuantize("fp8"), WithKVCacheDtype("fp8"), WithGPUs([]int{0})} {
		_, err := New(context.Background(), WithBackend("mlx"), WithPython("/nonexistent/python"), o)
		if err == nil || !strings.Contains(err.Error(), "needs the torch backend") {
			t.Errorf("New with the mlx backend: %v, want a refusal naming the torch backend", err)
		}
	}
}

func loadID(t *testing.T, e *Engine, id, dir string) *Model {
	t.Helper()
	m, err := e.Load(context.Background(), engine.ModelSpec{ID: id, Path: dir})
	if err != nil {
		t.Fatal(err)
	}
	return m.(*Model)
}

// TestTensorParallelEmbeds pools inputs beside a generating sequence under
// tensor parallel 2, on a decoder (the hidden state after the split
// layers) and an encoder (loaded whole on every rank), and wants tensor
// parallel 1's vectors and tokens.
func TestTensorParallelEmbeds(t *testing.T) {
	python(t)
	needGPUs(t, 2)
	dirs := map[string]bool{}
	for _, arch := range []string{"qwen3", "bert"} {
		dir := t.TempDir()
		if err := testmodel.Write(dir, testmodel.TinyFamily(arch)); err != nil {
			t.Fatal(err)
		}
		dirs[dir] = arch != "bert"
	}
	inputs := [][]int32{prompt(1, 5), prompt(2, 40), prompt(3, 1)}
	type result struct {
		vecs [][]float32
		toks []int32
	}
	run := func(e *Engine) map[string]result {
		out := map[string]result{}
		for dir, gen := range dirs {
			m := loadID(t, e, "m", dir)
			chunk := 0
			if gen {
				chunk = 7
			}
			vecs, toks := embedBeside(t, m, inputs, engine.PoolMean, chunk, gen)
			out[dir] = result{vecs, toks}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	one := newEngine(t)
	want := run(one)
	_ = one.Close()
	got := run(newEngine(t, WithTensorParallel(2)))
	for dir, w := range want {
		g := got[dir]
		if !slices.Equal(g.toks, w.toks) {
			t.Errorf("%s: tokens %v beside the pooled inputs, tp 1 %v", dir, g.toks, w.toks)
		}
		for i := range w.vecs {
			ref := make([]float64, len(w.vecs[i]))
			for j, v := range w.vecs[i] {
				ref[j] = float64(v)
			}
			if d := maxAbs(g.vecs[i], ref); d > 1e-5 {
				t.Errorf("%s: input %d differs from tp 1 by %g", dir, i, d)
			}
		}
	}
}

// needGPUs skips a CUDA run (MLXSERVING_TEST_DEVICE=cuda) on a host whose
// torch sees fewer than n GPUs; on the CPU (gloo) any n runs.
func needGPUs(t *testing.T, n int) {
	t.Helper()
	if os.Getenv("MLXSERVING_TEST_DEVICE") != "cuda" {
		return
	}
	out, err := exec.Command(python(t), "-c", "import torch; print(torch.cuda.device_count())").Output()
	if err != nil {
		t.Fatalf("counting CUDA devices: %v", err)
	}
	if got, _ := strconv.Atoi(strings.TrimSpace(string(out))); got < n {
		t.Skipf("tensor parallel %d needs %d CUDA devices; torch sees %d", n, n, got)
	}
}

package pyproc

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestHostileMXFP4: gpt_oss checkpoints whose MXFP4 experts are corrupt
// (blocks or scales of the wrong shape, a NaN scale, scales past the
// dtype's range), whose quant_method is unknown, or that claim MXFP4 for
// another family are refused as a CheckpointError naming the tensor or
// field; the worker goes on serving.
func TestHostileMXFP4(t *testing.T) {
	python(t)
	e := newEngine(t)
	const gu = "model.layers.0.mlp.experts.gate_up_proj"
	fill := func(v byte) func([]byte) {
		return func(b []byte) {
			for i := range b {
				b[i] = v
			}
		}
	}
	// TinyFamily("gpt_oss"): 4 experts, gate_up_proj [4, 64, 256] stored
	// as blocks [4, 256, 2, 16] and scales [4, 256, 2].
	for _, h := range []struct {
		name     string
		old, new string // header text replaced (same length)
		tensor   string // or a tensor's bytes edited
		edit     func([]byte)
		quant    any // or quantization_config's quant_method set
		arch     string
		want     string
	}{
		{name: "blocks of the wrong shape", old: `"shape":[4,256,2,16]`, new: `"shape":[4,256,1,32]`, want: gu + "_blocks"},
		{name: "scales of the wrong shape", old: `"shape":[4,256,2]`, new: `"shape":[4,128,4]`, want: gu + "_scales"},
		{name: "scales stored as int8", old: `"dtype":"U8","shape":[4,256,2]`, new: `"dtype":"I8","shape":[4,256,2]`, want: "I8"},
		{name: "a NaN scale", tensor: gu + "_scales", edit: fill(255), want: gu + "_scales"},
		{name: "scales past float32", tensor: gu + "_scales", edit: fill(254), want: gu + "_scales"},
		{name: "an unknown quant_method", quant: "mxfp6", want: "quant_method"},
		{name: "mxfp4 on llama", arch: "llama", want: "mxfp4"},
	} {
		t.Run(h.name, func(t *testing.T) {
			c := testmodel.TinyFamily("gpt_oss")
			c.Quant = testmodel.QuantMXFP4
			dir := t.TempDir()
			if err := testmodel.Write(dir, c); err != nil {
				t.Fatal(err)
			}
			switch {
			case h.tensor != "":
				editTensor(t, dir, h.tensor, h.edit)
			case h.old != "":
				renameTensors(t, dir, h.old, h.new)
			case h.quant != nil:
				editConfig(t, dir, "quantization_config", map[string]any{"quant_method": h.quant})
			case h.arch != "":
				editConfig(t, dir, "model_type", h.arch)
			}
			m, err := e.Load(context.Background(), engine.ModelSpec{ID: "bad", Path: dir})
			if !errors.Is(err, engine.ErrBadCheckpoint) || !strings.Contains(err.Error(), h.want) {
				t.Errorf("%v, want a CheckpointError naming %s", err, h.want)
				if m != nil {
					m.Close()
				}
			}
		})
	}
	m := load(t, e, tiny(t))
	generate(t, m, 1, prompt(1, 5), 3)
}

// TestGptOssSinksEmulated runs testdata/sinks_test.py: gpt_oss's sinks
// inside the CUDA fast paths on the CPU. The sink correction
// (out * sigmoid(L - s)) and the stand-in decode kernel's softmax against
// an explicit sink column (a short window and a fully masked row among
// them); then a tiny gpt_oss through the kernels, the varlen prompt
// attention, decode graphs and the speculated next step, all stood in by
// plain torch, against the plain path: the same tokens, logprobs within
// 1e-4.
func TestGptOssSinksEmulated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gpt_oss")
	if err := testmodel.Write(dir, testmodel.TinyFamily("gpt_oss")); err != nil {
		t.Fatal(err)
	}
	runPyCheck(t, "testdata/sinks_test.py", "runtime", dir)
}

// TestGptOssFastPathsCUDA (MLXSERVING_TEST_DEVICE=cuda only): a tiny
// gpt_oss served on the CUDA fast paths (the Triton kernels with its
// sinks, in bfloat16 the varlen prompt attention rescaled by its
// log-sum-exp, decode graphs where the experts capture) gives the plain
// torch path's distributions. Both are fed the same tokens (the plain
// path's greedy choices): prompts of 37, 150 and 300 tokens in one step,
// a fourth of 60 joining beside decodes, 40 steps in all, past the
// 16-token windows; the five largest log-probabilities of every sampled
// position agree within the dtype's tolerance, and the greedy tokens
// wherever the plain path's top two are apart. float32: every value
// within 1e-3. bfloat16: the two paths round and accumulate differently,
// and a near tie in the router moves a token's whole MLP output (one
// position's values at a time: 0.061, 0.172 and 0.266 seen at most in
// three H200 runs), so at most 2% of the values may pass 0.1 and none
// may pass 1; an error in the kernels moves most positions. The worker's stats must
// show the kernels (in bfloat16 the varlen call too) ran.
func TestGptOssFastPathsCUDA(t *testing.T) {
	if os.Getenv("MLXSERVING_TEST_DEVICE") != "cuda" {
		t.Skip("CUDA only (MLXSERVING_TEST_DEVICE=cuda)")
	}
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.TinyFamily("gpt_oss")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dtype string
		tol   fedTolerance
	}{{"bfloat16", fedTolerance{each: 0.1, share: 0.02, most: 1, tie: 0.5}}, {"float32", fedTolerance{each: 1e-3, most: 1e-3, tie: 2e-3}}} {
		t.Run(tc.dtype, func(t *testing.T) {
			e := newEngine(t, WithDType(tc.dtype))
			fast := load(t, e, dir)
			plain := load(t, newEngine(t, WithDType(tc.dtype), WithTuning(Tuning{NoKernels: true, NoVarlen: true}),
				WithCUDAGraphs(false)), dir)
			compareFed(t, fast, plain, tc.tol)
			st := workerStats(t, e, fast)
			t.Logf("fast paths: kernels %v, varlen %v, decode graph buckets %v", st["kernels"], st["varlen"], st["decode_graphs"])
			if st["kernels"] != true || (tc.dtype == "bfloat16" && st["varlen"] != true) {
				t.Errorf("worker stats %v: want the kernels (and in bfloat16 the varlen call) on", st)
			}
			// In bfloat16 the experts' grouped GEMM captures, so decode steps
			// replay graphs (TestGptOssLongPromptCUDA saw bucket 1 on an H200).
			if g, _ := st["decode_graphs"].([]any); tc.dtype == "bfloat16" && len(g) == 0 {
				t.Errorf("worker stats %v: want decode graphs captured in bfloat16", st)
			}
		})
	}
}

// fedTolerance bounds compareFed's log-probability differences: at most
// a share of the values may differ by more than each, none by more than
// most; the greedy tokens may differ only where the plain path's top two
// are within tie.
type fedTolerance struct{ each, share, most, tie float64 }

// compareFed runs the scenario of TestGptOssFastPathsCUDA on fast and
// plain, feeding both plain's greedy tokens.
func compareFed(t *testing.T, fast, plain *Model, tol fedTolerance) {
	t.Helper()
	var values, over int
	worst := 0.0
	ctx := context.Background()
	params := &engine.SamplingParams{Logprobs: true, TopLogprobs: 5}
	feed := map[engine.SeqID][]int32{}
	open := func(id engine.SeqID, n int) {
		p := prompt(int(id)+7, n)
		a, b := openFeed(t, fast, id, p), openFeed(t, plain, id, p)
		if len(a) != len(b) {
			t.Fatalf("seq %d: %d prompt tokens to feed on the fast path, %d on the plain", id, len(a), len(b))
		}
		feed[id] = a
		t.Cleanup(func() { fast.Free(id, ""); plain.Free(id, "") })
	}
	for i, n := range []int{37, 150, 300} {
		open(engine.SeqID(i+1), n)
	}
	for step := range 40 {
		if step == 5 {
			open(4, 60)
		}
		var batch []engine.StepInput
		for id := engine.SeqID(1); id <= 4; id++ {
			if f, ok := feed[id]; ok {
				batch = append(batch, engine.StepInput{Seq: id, Tokens: f, Sample: true, Params: params})
			}
		}
		of, err := fast.Step(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		op, err := plain.Step(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range op {
			f := of[i]
			for k := range p.Top {
				d := math.Abs(float64(p.Top[k].Logprob - f.Top[k].Logprob))
				values++
				worst = max(worst, d)
				if d > tol.each {
					over++
					t.Logf("step %d seq %d: log-probability %d is %.5f on the fast path, %.5f on the plain", step, p.Seq, k,
						f.Top[k].Logprob, p.Top[k].Logprob)
				}
				if d > tol.most {
					t.Fatalf("step %d seq %d: log-probability %d differs by %.5f (at most %g)", step, p.Seq, k, d, tol.most)
				}
			}
			if f.Token != p.Token && p.Top[0].Logprob-p.Top[1].Logprob > float32(tol.tie) {
				t.Fatalf("step %d seq %d: token %d on the fast path, %d on the plain (top %v)", step, p.Seq, f.Token, p.Token, p.Top)
			}
			feed[p.Seq] = []int32{p.Token}
		}
	}
	t.Logf("%d log-probabilities compared: %d differ by more than %g, at most by %.5f", values, over, tol.each, worst)
	if float64(over) > tol.share*float64(values) {
		t.Fatalf("%d of %d log-probabilities differ by more than %g (at most %.0f%% may)", over, values, tol.each, 100*tol.share)
	}
}

// longPrompt is the prompt TestGptOssLongPromptCUDA feeds: gpt-oss's
// whole context.
const longPrompt = 131072

// TestGptOssLongPromptCUDA (MLXSERVING_TEST_DEVICE=cuda only): a
// 131,072-token prompt on a gpt_oss with gpt-oss-20b's attention (64
// heads of 64 over 8 KV heads, windows of 128 alternating with full
// layers, YaRN to 131,072 positions; two layers and narrow experts) in
// bfloat16, fed in chunks of the worker's step budget through the varlen
// call, then 8 decode steps on the kernels (the cache split, the combine
// adding the sinks) and their graphs. The same with the kernels
// off (the plain attention decodes, in graphs per length bucket, from
// the same varlen prompt) must give the same distributions: the five
// largest log-probabilities of each step within 0.06. Logs how long the
// prompt and the decode steps took on each.
func TestGptOssLongPromptCUDA(t *testing.T) {
	if os.Getenv("MLXSERVING_TEST_DEVICE") != "cuda" {
		t.Skip("CUDA only (MLXSERVING_TEST_DEVICE=cuda)")
	}
	c := testmodel.TinyFamily("gpt_oss")
	c.Heads, c.KVHeads, c.HeadSize, c.SlidingWindow, c.DType = 64, 8, 64, 128, "bfloat16"
	c.ContextLength = longPrompt + 16
	c.Yarn = &testmodel.Yarn{Factor: 32, OriginalMaxPositionEmbeddings: 4096, BetaFast: 32, BetaSlow: 1, NoTruncate: true}
	dir := t.TempDir()
	if err := testmodel.Write(dir, c); err != nil {
		t.Fatal(err)
	}
	var tops [2][][]engine.TokenLogprob
	for i, tuning := range []Tuning{{}, {NoKernels: true}} {
		e := newEngine(t, WithDType("bfloat16"), WithTuning(tuning))
		m, err := e.Load(context.Background(), engine.ModelSpec{ID: "long", Path: dir, KVCapacity: 2 * c.ContextLength})
		if err != nil {
			t.Fatal(err)
		}
		tops[i] = decodeLong(t, m.(*Model), tuning.NoKernels)
		st := workerStats(t, e, m.(*Model))
		t.Logf("kernels off %v: stats kernels %v, varlen %v, decode graph buckets %v", tuning.NoKernels, st["kernels"], st["varlen"],
			st["decode_graphs"])
		if st["varlen"] != true || st["kernels"] != !tuning.NoKernels {
			t.Errorf("worker stats %v: want the varlen call, and the kernels unless turned off", st)
		}
		m.Close()
	}
	for s := range tops[0] {
		for k := range tops[0][s] {
			if d := math.Abs(float64(tops[0][s][k].Logprob - tops[1][s][k].Logprob)); d > 0.06 {
				t.Errorf("step %d (0: the prompt's last position): log-probability %d is %.5f with the kernels, %.5f without", s, k,
					tops[0][s][k].Logprob,
					tops[1][s][k].Logprob)
			}
		}
	}
}

// decodeLong feeds m the long prompt in chunks of its step budget, then
// 8 one-token steps of fixed tokens (the same on both paths); returns the
// top five of the prompt's last position and of each decode step.
func decodeLong(t *testing.T, m *Model, plain bool) [][]engine.TokenLogprob {
	t.Helper()
	ctx := context.Background()
	p := prompt(3, longPrompt)
	feed := openFeed(t, m, 1, p)
	defer m.Free(1, "")
	chunk := max(m.Info().StepTokens, 512)
	params := &engine.SamplingParams{Logprobs: true, TopLogprobs: 5}
	t0 := time.Now()
	var tops [][]engine.TokenLogprob
	for len(feed) > 0 {
		n := min(chunk, len(feed))
		o, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: feed[:n], Sample: n == len(feed), Params: params}})
		if err != nil {
			t.Fatal(err)
		}
		if n == len(feed) {
			tops = append(tops, o[0].Top)
		}
		feed = feed[n:]
	}
	t.Logf("kernels off %v: %d-token prompt in %v (chunks of %d)", plain, len(p), time.Since(t0).Round(time.Millisecond), chunk)
	t0 = time.Now()
	for s := range 8 {
		o, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: []int32{int32(s*41+7) % 379}, Sample: true, Params: params}})
		if err != nil {
			t.Fatal(err)
		}
		tops = append(tops, o[0].Top)
	}
	t.Logf("kernels off %v: 8 decode steps at %d tokens in %v", plain, len(p), time.Since(t0).Round(time.Millisecond))
	return tops
}

//go:build mlx

package mlx

import (
	"context"
	"math"
	"os"
	"slices"
	"testing"

	"go.uber.org/goleak"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

func TestMain(m *testing.M) {
	// The tests compare float32 results with exact references: no TF32 on
	// a GPU that has it (see the package doc).
	if _, set := os.LookupEnv("MLX_ENABLE_TF32"); !set {
		_ = os.Setenv("MLX_ENABLE_TF32", "0")
	}
	goleak.VerifyTestMain(m)
}

func newEngine(t testing.TB, opts ...Option) *Engine {
	t.Helper()
	e, err := New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func load(t testing.TB, e *Engine, dir string) *model {
	t.Helper()
	m, err := e.Load(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir})
	if err != nil {
		t.Fatal(err)
	}
	return m.(*model)
}

func tinyDir(t testing.TB, edit func(*testmodel.Config)) string {
	t.Helper()
	cfg := testmodel.Tiny()
	if edit != nil {
		edit(&cfg)
	}
	dir := t.TempDir()
	if err := testmodel.Write(dir, cfg); err != nil {
		t.Fatal(err)
	}
	return dir
}

func prompts() [][]int32 {
	return [][]int32{
		{1, 72, 101, 108, 108, 111},
		{1, 200, 17, 33},
		{1, 5, 9, 300, 301, 302, 303, 304, 42, 43, 44},
		{1, 250},
	}
}

// generate runs one sequence alone: prefill in chunks of chunk tokens,
// then n greedy (or p) tokens.
func generate(t testing.TB, m engine.Model, id engine.SeqID, prompt []int32, n, chunk int, p *engine.SamplingParams) ([]int32, []float32) {
	t.Helper()
	ctx := context.Background()
	if _, err := m.Open(ctx, id, prompt, ""); err != nil {
		t.Fatal(err)
	}
	defer m.Free(id, "")
	var toks []int32
	var lps []float32
	for i := 0; i < len(prompt); i += chunk {
		end := min(i+chunk, len(prompt))
		out, err := m.Step(ctx, []engine.StepInput{{Seq: id, Tokens: prompt[i:end], Sample: end == len(prompt), Params: p}})
		if err != nil {
			t.Fatal(err)
		}
		if end == len(prompt) {
			toks, lps = append(toks, out[0].Token), append(lps, out[0].Logprob)
		}
	}
	for len(toks) < n {
		out, err := m.Step(ctx, []engine.StepInput{{Seq: id, Tokens: toks[len(toks)-1:], Sample: true, Params: p}})
		if err != nil {
			t.Fatal(err)
		}
		toks, lps = append(toks, out[0].Token), append(lps, out[0].Logprob)
	}
	return toks, lps
}

// generateBatch runs all prompts together: sequence i prefills in chunks of
// i+1 tokens while the others already decode, so every step mixes prefill
// and decode of different lengths.
func generateBatch(t testing.TB, m engine.Model, ps [][]int32, n int, p *engine.SamplingParams) [][]int32 {
	t.Helper()
	ctx := context.Background()
	fed := make([]int, len(ps))
	out := make([][]int32, len(ps))
	for i, pr := range ps {
		if _, err := m.Open(ctx, engine.SeqID(100+i), pr, ""); err != nil {
			t.Fatal(err)
		}
		defer m.Free(engine.SeqID(100+i), "")
	}
	for {
		var batch []engine.StepInput
		var who []int
		for i, pr := range ps {
			switch {
			case fed[i] < len(pr):
				end := min(fed[i]+i+1, len(pr))
				batch = append(batch, engine.StepInput{Seq: engine.SeqID(100 + i), Tokens: pr[fed[i]:end], Sample: end == len(pr), Params: p})
				fed[i] = end
				if end == len(pr) {
					who = append(who, i)
				}
			case len(out[i]) < n:
				batch = append(batch, engine.StepInput{Seq: engine.SeqID(100 + i), Tokens: out[i][len(out[i])-1:], Sample: true, Params: p})
				who = append(who, i)
			}
		}
		if len(batch) == 0 {
			return out
		}
		res, err := m.Step(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != len(who) {
			t.Fatalf("%d outputs for %d sampling inputs", len(res), len(who))
		}
		for j, i := range who {
			if res[j].Seq != engine.SeqID(100+i) {
				t.Fatalf("output %d is for seq %d, want %d", j, res[j].Seq, 100+i)
			}
			out[i] = append(out[i], res[j].Token)
		}
	}
}

func TestBatchEqualsAlone(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tinyDir(t, nil))
	greedy := &engine.SamplingParams{}
	var alone [][]int32
	for i, p := range prompts() {
		toks, _ := generate(t, m, engine.SeqID(i), p, 12, len(p), greedy)
		chunked, _ := generate(t, m, engine.SeqID(i), p, 12, 3, greedy)
		if !slices.Equal(toks, chunked) {
			t.Errorf("prompt %d: chunked prefill %v, whole %v", i, chunked, toks)
		}
		alone = append(alone, toks)
	}
	batched := generateBatch(t, m, prompts(), 12, greedy)
	for i := range alone {
		if !slices.Equal(alone[i], batched[i]) {
			t.Errorf("prompt %d: batched %v, alone %v", i, batched[i], alone[i])
		}
	}
	if distinct := len(slices.Compact(slices.Clone(alone[0]))); distinct < 3 {
		t.Errorf("greedy output %v barely varies: the test model is not exercising the forward pass", alone[0])
	}
	// Seeded sampling is reproducible and independent of the batch.
	seeded := &engine.SamplingParams{Temperature: 1, TopP: 0.9, TopK: 50, MinP: 0.01, RepetitionPenalty: 1.2, Seed: 7, HasSeed: true}
	a := generateBatch(t, m, prompts(), 10, seeded)
	b, _ := generate(t, m, 1, prompts()[0], 10, 100, seeded)
	if !slices.Equal(a[0], b) {
		t.Errorf("seeded: batched %v, alone %v", a[0], b)
	}
	other := *seeded
	other.Seed = 8
	c, _ := generate(t, m, 1, prompts()[0], 10, 100, &other)
	if slices.Equal(b, c) {
		t.Errorf("seeds 7 and 8 gave the same tokens %v", b)
	}
	top1 := &engine.SamplingParams{Temperature: 1.5, TopK: 1}
	d, _ := generate(t, m, 1, prompts()[0], 10, 100, top1)
	if !slices.Equal(d, alone[0][:10]) {
		t.Errorf("top_k 1: %v, greedy %v", d, alone[0])
	}
}

func TestLogprobs(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tinyDir(t, nil))
	toks, lps := generate(t, m, 1, prompts()[0], 4, 100, &engine.SamplingParams{Logprobs: true})
	logits := lastLogits(t, m, prompts()[0])
	var lse float64
	mx := math.Inf(-1)
	for _, l := range logits {
		mx = math.Max(mx, float64(l))
	}
	for _, l := range logits {
		lse += math.Exp(float64(l) - mx)
	}
	want := float64(logits[toks[0]]) - mx - math.Log(lse)
	if math.Abs(float64(lps[0])-want) > 1e-4 || lps[0] > 0 {
		t.Fatalf("logprob %v, want %v", lps[0], want)
	}
}

// lastLogits returns the logits after prompt, through the engine's forward.
func lastLogits(t testing.TB, m *model, prompt []int32) []float32 {
	t.Helper()
	var out []float32
	err := m.call(func(g *graph) error {
		s := &seqState{}
		defer s.free()
		lg := m.forward(g, []feed{{seq: s, tokens: prompt, sample: true}}, true)
		g.eval(lg)
		if g.err != nil {
			return g.err
		}
		var err error
		out, err = readFloat32s(lg)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func maxDiff(a, b []float32) (diff, scale float64) {
	for i := range a {
		diff = math.Max(diff, math.Abs(float64(a[i]-b[i])))
		scale = math.Max(scale, math.Abs(float64(b[i])))
	}
	return diff, scale
}

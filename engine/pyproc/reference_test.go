package pyproc

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os/exec"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestMatchesReference checks the runtime against testdata/reference.py, a
// plain float64 forward pass without caches, on each architecture the
// runtime supports (testmodel.TinyFamily of every family, whose sliding
// windows of 16 the 70-token prompt crosses, and llama with llama3 rope
// scaling and a tied head): the greedy tokens must agree wherever the
// reference's top two logits are not a near tie, and log-probabilities
// within 1e-4.
func TestMatchesReference(t *testing.T) {
	py := python(t)
	scaled := testmodel.Tiny()
	scaled.RopeScaling = &testmodel.RopeScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 64}
	scaled.RopeTheta = 500000
	scaled.TieEmbeddings = true
	mistral := testmodel.Tiny()
	mistral.Arch, mistral.Seed, mistral.Layers = "mistral", 4, 3
	cases := map[string]testmodel.Config{"llama3-scaled-tied": scaled, "mistral-full": mistral}
	for _, arch := range testmodel.Archs() {
		if referenceArchs[arch] {
			cases[arch] = testmodel.TinyFamily(arch)
		}
	}
	e := newEngine(t)
	const n = 6
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			prompts := [][]int32{prompt(1, 5), prompt(2, 70), prompt(3, 1)}
			if cfg.Arch == "phi3" {
				// Past longrope's original context (128 tokens here) in one
				// chunk: every position takes the long factors, as in
				// transformers.
				prompts = append(prompts, prompt(4, 150))
			}
			dir := t.TempDir()
			if err := testmodel.Write(dir, cfg); err != nil {
				t.Fatal(err)
			}
			ref := runReference(t, py, dir, prompts, n)
			m, err := e.Load(context.Background(), engine.ModelSpec{ID: name, Path: dir})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			for i, p := range prompts {
				toks, lps := generateLogprobs(t, m.(*Model), engine.SeqID(i), p, n)
				for k := range toks {
					if toks[k] != ref[i].Tokens[k] {
						if ref[i].Gaps[k] < 1e-3 {
							break // a near tie: either token is right; the rest diverges
						}
						t.Fatalf("prompt %d token %d: %d, reference %d (gap %.4f)", i, k, toks[k], ref[i].Tokens[k], ref[i].Gaps[k])
					}
					if d := math.Abs(float64(lps[k]) - ref[i].Logprobs[k]); d > 1e-4 {
						t.Errorf("prompt %d token %d: logprob %v, reference %v", i, k, lps[k], ref[i].Logprobs[k])
					}
				}
			}
		})
	}
}

// referenceArchs are the families TestMatchesReference runs.
var referenceArchs = map[string]bool{"llama": true, "qwen2": true, "qwen3": true}

type referenceRun struct {
	Tokens   []int32
	Logprobs []float64
	Gaps     []float64
}

// runReference runs testdata/reference.py on the checkpoint in dir: n
// greedy tokens after each prompt.
func runReference(t *testing.T, py, dir string, prompts [][]int32, n int) []referenceRun {
	t.Helper()
	in, _ := json.Marshal(map[string]any{"prompts": prompts, "n": n})
	cmd := exec.Command(py, "testdata/reference.py", dir)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("reference: %v\n%s", err, stderr.String())
	}
	var ref []referenceRun
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatal(err)
	}
	return ref
}

func generateLogprobs(t *testing.T, m *Model, seq engine.SeqID, prompt []int32, n int) ([]int32, []float32) {
	t.Helper()
	ctx := context.Background()
	feed := openFeed(t, m, seq, prompt)
	defer m.Free(seq, "")
	params := &engine.SamplingParams{Logprobs: true}
	var toks []int32
	var lps []float32
	for len(toks) < n {
		o, err := m.Step(ctx, []engine.StepInput{{Seq: seq, Tokens: feed, Sample: true, Params: params}})
		if err != nil {
			t.Fatal(err)
		}
		toks, lps = append(toks, o[0].Token), append(lps, o[0].Logprob)
		feed = []int32{o[0].Token}
	}
	return toks, lps
}

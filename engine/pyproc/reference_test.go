package pyproc

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/internal/reference"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestMatchesReference checks the runtime against internal/reference/reference.py, a
// plain float64 forward pass without caches, on each architecture the
// runtime supports (testmodel.TinyFamily of every family, whose sliding
// windows of 16 the 70-token prompt crosses, llama with llama3 rope
// scaling and a tied head, enginetest.YarnConfigs, and gpt_oss with its
// experts in MXFP4 as published and dequantized): the greedy
// tokens must agree wherever the reference's top two logits are not a
// near tie, and log-probabilities within 1e-4.
func TestMatchesReference(t *testing.T) {
	py := python(t)
	scaled := testmodel.Tiny()
	scaled.RopeScaling = &testmodel.RopeScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 64}
	scaled.RopeTheta = 500000
	scaled.TieEmbeddings = true
	mistral := testmodel.Tiny()
	mistral.Arch, mistral.Seed, mistral.Layers = "mistral", 4, 3
	cases := map[string]testmodel.Config{"llama3-scaled-tied": scaled, "mistral-full": mistral}
	for name, cfg := range enginetest.YarnConfigs() {
		cases[name] = cfg
	}
	for _, arch := range testmodel.TorchArchs() {
		if referenceArchs[arch] {
			cases[arch] = testmodel.TinyFamily(arch)
		}
	}
	// gpt_oss as OpenAI publishes it: the experts in MXFP4 (TinyFamily
	// writes them dequantized, as float tensors).
	oss := testmodel.TinyFamily("gpt_oss")
	oss.Quant = testmodel.QuantMXFP4
	cases["gpt_oss-mxfp4"] = oss
	// gemma3 as transformers 4.52 and later write it: the language model
	// under model.language_model.
	cases["gemma3-newer"] = testmodel.TinyFamily("gemma3")
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
			if name == "gemma3-newer" {
				renameTensors(t, dir, "language_model.model.", "model.language_model.")
			}
			ref := runReference(t, py, dir, prompts, n)
			m, err := e.Load(context.Background(), engine.ModelSpec{ID: name, Path: dir})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			// The 70-token prompt a second time in chunks of 24: chunks
			// after the first attend over their cached prefix (and slide
			// past it).
			runs := append([][]int32(nil), prompts...)
			runs = append(runs, prompts[1])
			for i, p := range runs {
				chunk := 0
				if i == len(prompts) {
					i, chunk = 1, 24
				}
				toks, lps := generateChunked(t, m.(*Model), engine.SeqID(i+100*chunk), p, n, chunk)
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

// TestTransformersV5Config checks a checkpoint whose config.json has
// transformers 5's names (rope_parameters, dtype, num_local_experts) runs
// as the published names do: the same weights give the same tokens and
// log-probabilities.
func TestTransformersV5Config(t *testing.T) {
	python(t)
	e := newEngine(t)
	for _, arch := range []string{"gemma3_text", "gemma3", "qwen3_moe", "phi3", "llama", "gpt_oss"} {
		t.Run(arch, func(t *testing.T) {
			var got [2][]float32
			for i, v5 := range []bool{false, true} {
				cfg := testmodel.TinyFamily(arch)
				cfg.TransformersV5 = v5
				dir := t.TempDir()
				if err := testmodel.Write(dir, cfg); err != nil {
					t.Fatal(err)
				}
				m, err := e.Load(context.Background(), engine.ModelSpec{ID: fmt.Sprintf("%s-%d", arch, i), Path: dir})
				if err != nil {
					t.Fatal(err)
				}
				for j, p := range [][]int32{prompt(2, 70), prompt(4, 150)} {
					_, lps := generateChunked(t, m.(*Model), engine.SeqID(j), p, 4, 0)
					got[i] = append(got[i], lps...)
				}
				m.Close()
			}
			if !slices.Equal(got[0], got[1]) {
				t.Fatalf("logprobs %v with the published names, %v with transformers 5's", got[0], got[1])
			}
		})
	}
}

// referenceArchs are the families TestMatchesReference runs.
var referenceArchs = map[string]bool{"llama": true, "mistral": true, "qwen2": true, "qwen3": true, "qwen3_moe": true, "mixtral": true, "gemma2": true, "gemma3_text": true, "gemma3": true, "phi3": true, "olmo2": true, "gpt_oss": true}

// renameTensors replaces old with new (of the same length) in the names of
// dir's model.safetensors, leaving the offsets as they are.
func renameTensors(t *testing.T, dir, old, new string) {
	t.Helper()
	path := filepath.Join(dir, "model.safetensors")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(old) != len(new) {
		t.Fatalf("renameTensors: %q and %q differ in length", old, new)
	}
	n := 8 + int(binary.LittleEndian.Uint64(raw))
	copy(raw[8:n], bytes.ReplaceAll(raw[8:n], []byte(old), []byte(new)))
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
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

// generateChunked runs n greedy steps with logprobs after prompt, fed in
// steps of chunk tokens (0: all at once).
func generateChunked(t *testing.T, m *Model, seq engine.SeqID, prompt []int32, n, chunk int) ([]int32, []float32) {
	t.Helper()
	ctx := context.Background()
	feed := openFeed(t, m, seq, prompt)
	defer m.Free(seq, "")
	params := &engine.SamplingParams{Logprobs: true}
	for chunk > 0 && len(feed) > chunk {
		if _, err := m.Step(ctx, []engine.StepInput{{Seq: seq, Tokens: feed[:chunk]}}); err != nil {
			t.Fatal(err)
		}
		feed = feed[chunk:]
	}
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

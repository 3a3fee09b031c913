package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/pyproc"
	"github.com/mlxserving/mlxserving/testmodel"
)

// checkTiny compares greedy tokens and logprobs with transformers on a tiny
// float32 checkpoint (llama3 rope scaling, tied embeddings), the engine
// configured as for the benchmark (graphs, kernels, lookahead).
func checkTiny(ctx context.Context, logger *slog.Logger) {
	e, err := pyproc.New(ctx, pyproc.WithPython(*python), pyproc.WithDevice(*device), pyproc.WithDType("float32"),
		pyproc.WithLogger(logger), pyproc.WithStartTimeout(5*time.Minute), pyproc.WithLookahead(*lookahead), tuning())
	must(err)
	defer e.Close()
	d, err := os.MkdirTemp("", "tiny")
	must(err)
	cfg := testmodel.Tiny()
	cfg.RopeScaling = &testmodel.RopeScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 64}
	cfg.TieEmbeddings, cfg.RopeTheta = true, 500000
	must(testmodel.Write(d, cfg))
	prompts := [][]int32{{1, 2, 3}, make([]int32, 90), {200}}
	for i := range prompts[1] {
		prompts[1][i] = int32(i * 37 % 380)
	}
	const n = 8
	in, _ := json.Marshal(map[string]any{"prompts": prompts, "n": n})
	var ref []struct {
		Tokens   []int32
		Logprobs []float64
	}
	must(json.Unmarshal(run(in, *python, *script, "check", d, "float32"), &ref))
	mi, err := e.Load(ctx, engine.ModelSpec{ID: "tiny", Path: d})
	must(err)
	defer mi.Close()
	// Free-running greedy decoding, all prompts in one batch: lookahead and
	// the decode kernels run as in serving.
	agree, total, maxDiff := 0, 0, 0.0
	batch := make([]engine.StepInput, len(prompts))
	for i, p := range prompts {
		_, err := mi.Open(ctx, engine.SeqID(i+1), p, "")
		must(err)
		batch[i] = engine.StepInput{Seq: engine.SeqID(i + 1), Tokens: p, Sample: true, Params: &engine.SamplingParams{Logprobs: true}}
	}
	diverged := make([]bool, len(prompts))
	for k := 0; k < n; k++ {
		outs, err := mi.Step(ctx, batch)
		must(err)
		for i, o := range outs {
			if diverged[i] {
				continue
			}
			total++
			if o.Token == ref[i].Tokens[k] {
				agree++
				maxDiff = math.Max(maxDiff, math.Abs(float64(o.Logprob)-ref[i].Logprobs[k]))
			} else {
				diverged[i] = true
			}
			batch[i].Tokens = []int32{o.Token}
		}
	}
	fmt.Printf("vs transformers (tiny float32, llama3 scaling, tied; batched, free-running): %d/%d greedy tokens agree, max |logprob diff| %.2g\n",
		agree, total, maxDiff)
}

func run(stdin []byte, name string, args ...string) []byte {
	cmd := exec.Command(name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	must(err)
	return out
}

func runJSON(name string, args ...string) map[string]float64 {
	var res map[string]float64
	out := run(nil, name, args...)
	if err := json.Unmarshal(out, &res); err != nil {
		must(fmt.Errorf("%s %v: %w", name, args, err))
	}
	return res
}

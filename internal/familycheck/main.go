// Command familycheck runs greedy generation on one engine for a list of
// token-id prompts and prints each prompt's tokens and their
// log-probabilities as JSON, for hf_families.py to compare with
// transformers. The prompts run as one batch, as a server runs them:
// prompt chunks of -chunk tokens beside the other sequences' decode steps.
// With -one they run one at a time, so every decode step is one row, as a
// server's steps are with a single client: the engine's one-row products,
// which a batch never reaches.
//
//	familycheck -engine pyproc -dir CKPT -in prompts.json -n 32 -dtype float32 > out.json
//
// With -embed it embeds the inputs instead, with every pooling (see
// hf_embed.py), and with -bench B it times embedding batches of B inputs
// of -bench-tokens tokens:
//
//	familycheck -embed -dir CKPT -in inputs.json -dtype bfloat16 > out.json
//	familycheck -bench 64 -bench-tokens 128 -dir CKPT -dtype bfloat16
//
// Built without the mlx tag it serves only -engine pyproc; with it (and
// MLX's libraries on the loader's path) also -engine mlx.
//
// For LoRA (lora.sh), -write adapter writes a PEFT adapter of -shape
// (bfloat16, -adapter-rank, -adapter-seed) and -write merged the shape
// with that adapter merged into its weights.
//
// For the quantized checkpoints (quant.sh), -write LAYOUT writes
// testmodel's checkpoint of -shape in that layout (testmodel.AllQuants, or
// "float") into -dir and exits, and -quantize fp8 loads with
// pyproc.WithQuantize:
//
//	familycheck -write awq -shape quant -dir /tmp/q/awq
//	familycheck -engine pyproc -dir /tmp/q/float -quantize fp8 -in prompts.json -n 16 -dtype bfloat16 > out.json
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/mlx"
	"github.com/mlxserving/mlxserving/engine/pyproc"
	"github.com/mlxserving/mlxserving/testmodel"
)

type result struct {
	Tokens   []int32   `json:"tokens"`
	Logprobs []float32 `json:"logprobs"`
}

func main() {
	var (
		engName  = flag.String("engine", "pyproc", "pyproc or mlx")
		dir      = flag.String("dir", "", "checkpoint directory")
		in       = flag.String("in", "", "prompts: a JSON list of token-id lists")
		n        = flag.Int("n", 32, "tokens to generate a prompt")
		chunk    = flag.Int("chunk", 256, "prompt tokens a sequence feeds a step")
		dtype    = flag.String("dtype", "", "pyproc: weights' dtype (float32, bfloat16; empty: the engine's default)")
		device   = flag.String("device", "", "pyproc: torch device (cuda, cpu; empty: the best there is)")
		python   = flag.String("python", "", "pyproc: Python interpreter")
		quantize = flag.String("quantize", "", "pyproc: fp8 quantizes a float checkpoint at load (pyproc.WithQuantize)")
		scaledMM = flag.Bool("fp8-scaled-mm", true, "pyproc: FP8 projections of 16 rows or more as W8A8 (pyproc.Tuning.NoFP8ScaledMM)")
		write    = flag.String("write", "", "write testmodel's checkpoint in this layout (float, "+strings.Join(testmodel.AllQuants(), ", ")+"), or a LoRA adapter of the shape (adapter) or the shape with that adapter merged (merged), into -dir and exit")
		rank     = flag.Int("adapter-rank", 16, "-write adapter or merged: the adapter's rank")
		aseed    = flag.Int64("adapter-seed", 1, "-write adapter or merged: the adapter's seed")
		shape    = flag.String("shape", "quant", "-write: quant (testmodel.TinyQuant, bfloat16, 4 layers) or a testmodel shape (llama1b, llama8b, ...)")
		embed    = flag.Bool("embed", false, "embed the inputs with each pooling instead of generating")
		bench    = flag.Int("bench", 0, "time embedding batches of this many inputs (no -in)")
		benchN   = flag.Int("bench-tokens", 128, "tokens an input with -bench")
		benchS   = flag.Float64("bench-seconds", 20, "how long -bench runs")
		one      = flag.Bool("one", false, "generate for one prompt at a time, so decode steps run at one row (the one-row products), not the prompts as one batch")
	)
	flag.Parse()
	// The figures compare with transformers in float32: MLX runs float32
	// matrix products in TF32 on a GPU that has it unless told so.
	if _, set := os.LookupEnv("MLX_ENABLE_TF32"); !set {
		_ = os.Setenv("MLX_ENABLE_TF32", "0")
	}
	if *write != "" {
		adapter = testmodel.Adapter{Rank: *rank, Seed: *aseed, DType: "bfloat16"}
		if err := writeCheckpoint(*dir, *write, *shape); err != nil {
			fmt.Fprintln(os.Stderr, "familycheck:", err)
			os.Exit(1)
		}
		return
	}
	quantizeOpt, weightOnlyFP8 = *quantize, !*scaledMM
	var err error
	switch {
	case *bench > 0:
		err = runBench(*engName, *dir, *dtype, *device, *python, *bench, *benchN, *benchS)
	case *embed:
		err = runEmbed(*engName, *dir, *in, *chunk, *dtype, *device, *python)
	default:
		err = run(*engName, *dir, *in, *n, *chunk, *dtype, *device, *python, *one)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "familycheck:", err)
		os.Exit(1)
	}
}

// run generates for the prompts in in, as one batch or (one) a prompt at
// a time, and prints the results as JSON.
func run(engName, dir, in string, n, chunk int, dtype, device, python string, one bool) error {
	raw, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	var prompts [][]int32
	if err := json.Unmarshal(raw, &prompts); err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	if len(prompts) == 0 || n <= 0 || chunk <= 0 {
		return errors.New("want prompts, -n > 0 and -chunk > 0")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	eng, err := newEngine(ctx, engName, dtype, device, python)
	if err != nil {
		return err
	}
	defer eng.Close()
	total := 0
	for _, p := range prompts {
		total += len(p) + n
	}
	m, err := eng.Load(ctx, engine.ModelSpec{ID: "check", Path: dir, MaxBatch: len(prompts), KVCapacity: total + 64*len(prompts)})
	if err != nil {
		return err
	}
	defer m.Close()
	var out []result
	if one {
		for i := range prompts {
			got, err := generate(ctx, m, prompts[i:i+1], n, chunk)
			if err != nil {
				return fmt.Errorf("prompt %d: %w", i, err)
			}
			out = append(out, got...)
		}
	} else if out, err = generate(ctx, m, prompts, n, chunk); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// runEmbed loads the checkpoint and embeds the inputs (embedRun).
func runEmbed(engName, dir, in string, chunk int, dtype, device, python string) error {
	raw, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	var inputs [][]int32
	if err := json.Unmarshal(raw, &inputs); err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	if len(inputs) == 0 || chunk <= 0 {
		return errors.New("want inputs and -chunk > 0")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	eng, err := newEngine(ctx, engName, dtype, device, python)
	if err != nil {
		return err
	}
	defer eng.Close()
	m, err := eng.Load(ctx, engine.ModelSpec{ID: "check", Path: dir, MaxBatch: len(inputs)})
	if err != nil {
		return err
	}
	defer m.Close()
	return embedRun(ctx, m, inputs, chunk)
}

// runBench loads the checkpoint and times embedding batches (embedBench).
func runBench(engName, dir, dtype, device, python string, batch, n int, seconds float64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	eng, err := newEngine(ctx, engName, dtype, device, python)
	if err != nil {
		return err
	}
	defer eng.Close()
	m, err := eng.Load(ctx, engine.ModelSpec{ID: "bench", Path: dir, MaxBatch: batch})
	if err != nil {
		return err
	}
	defer m.Close()
	return embedBench(ctx, m, batch, n, seconds)
}

// quantizeOpt is -quantize; weightOnlyFP8 is -fp8-scaled-mm=false.
var (
	quantizeOpt   string
	weightOnlyFP8 bool
)

// writeCheckpoint writes testmodel's checkpoint of shape in layout into
// dir: "quant" is TinyQuant with 4 layers in bfloat16 (every width a
// multiple of 128, small enough for the float64 reference), else a real
// shape (testmodel.Shapes).
func writeCheckpoint(dir, layout, shape string) error {
	cfg := testmodel.TinyQuant()
	cfg.Layers, cfg.DType = 4, "bfloat16"
	if shape != "quant" {
		mk, ok := testmodel.Shapes()[shape]
		if !ok {
			return fmt.Errorf("-shape %q: want quant or a testmodel shape", shape)
		}
		cfg = mk()
	}
	switch layout {
	case "float":
	case "adapter":
		return testmodel.WriteAdapter(dir, cfg, adapter)
	case "merged":
		cfg.Merge = &adapter
	default:
		cfg.Quant = layout
	}
	return testmodel.Write(dir, cfg)
}

// adapter is what -write adapter and merged write (the -adapter-* flags).
var adapter testmodel.Adapter

func newEngine(ctx context.Context, name, dtype, device, python string) (engine.Engine, error) {
	switch name {
	case "pyproc":
		var opts []pyproc.Option
		if dtype != "" {
			opts = append(opts, pyproc.WithDType(dtype))
		}
		if device != "" {
			opts = append(opts, pyproc.WithDevice(device))
		}
		if python != "" {
			opts = append(opts, pyproc.WithPython(python))
		}
		if quantizeOpt != "" {
			opts = append(opts, pyproc.WithQuantize(quantizeOpt))
		}
		if weightOnlyFP8 {
			opts = append(opts, pyproc.WithTuning(pyproc.Tuning{NoFP8ScaledMM: true}))
		}
		return pyproc.New(ctx, opts...)
	case "mlx":
		return mlx.New()
	}
	return nil, fmt.Errorf("unknown engine %q", name)
}

// generate runs every prompt to n greedy tokens in one batch: each step
// carries a chunk of every prompt still prefilling and one token of every
// sequence decoding.
func generate(ctx context.Context, m engine.Model, prompts [][]int32, n, chunk int) ([]result, error) {
	params := &engine.SamplingParams{Logprobs: true}
	out := make([]result, len(prompts))
	fed := make([]int, len(prompts))
	for i, p := range prompts {
		if _, err := m.Open(ctx, engine.SeqID(i), p, ""); err != nil {
			return nil, fmt.Errorf("open prompt %d (%d tokens): %w", i, len(p), err)
		}
		defer m.Free(engine.SeqID(i), "")
	}
	for {
		var batch []engine.StepInput
		for i, p := range prompts {
			switch {
			case fed[i] < len(p):
				end := min(len(p), fed[i]+chunk)
				batch = append(batch, engine.StepInput{Seq: engine.SeqID(i), Tokens: p[fed[i]:end], Sample: end == len(p), Params: params})
				fed[i] = end
			case len(out[i].Tokens) < n:
				last := out[i].Tokens[len(out[i].Tokens)-1]
				batch = append(batch, engine.StepInput{Seq: engine.SeqID(i), Tokens: []int32{last}, Sample: true, Params: params})
			}
		}
		if len(batch) == 0 {
			return out, nil
		}
		got, err := m.Step(ctx, batch)
		if err != nil {
			return nil, err
		}
		for _, o := range got {
			r := &out[o.Seq]
			if len(r.Tokens) < n {
				r.Tokens = append(r.Tokens, o.Token)
				r.Logprobs = append(r.Logprobs, o.Logprob)
			}
		}
	}
}

//go:build mlx

// Command mlxbench measures the MLX engine's decode throughput with the
// same workload as gpubench (cmd/gpubench), so the two
// engines' rows compare: a Llama-3.2-1B-shaped bf16 checkpoint with random
// weights, a 128-token prompt per sequence prefilled in one step, then 128
// greedy decode steps for the whole batch, at each batch size. Beside
// tokens/s it prints the MLX primitives a decode step builds, whole and
// per decoder layer (mlx.PrimitiveCount). -fused=false turns the
// engine's fused decode kernels off on a CUDA GPU, so one binary measures
// both (before the option existed, the environment variable
// MLXSERVING_MLX_FUSED=0 did).
//
//	go build -tags mlx -o bin/mlxbench ./cmd/mlxbench
//	bin/mlxbench -dir /tmp/llama1b -batches 1,8,32,64 -device gpu
//
// -quant measures a quantized checkpoint of -shape instead: mlx4 or mlx8
// (MLX's own affine format, written from the bf16 checkpoint by
// Engine.Quantize, group 64 as mlx-community's), or a transformers layout
// testmodel writes (awq, gptq: requantized to MLX 4-bit at load; fp8,
// fp8-channel: dequantized at load), into -dir:
//
//	bin/mlxbench -shape llama8b -quant mlx4 -dir /tmp/llama8b-mlx4 -batches 1,64
//
// cmd/mlxbench/device.sh runs it on a CUDA machine.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/mlx"
	"github.com/mlxserving/mlxserving/testmodel"
)

func main() {
	dir := flag.String("dir", "/tmp/llama1b", "checkpoint directory; written if missing")
	batches := flag.String("batches", "1,8,32,64", "decode batch sizes")
	prompt := flag.Int("prompt", 128, "prompt tokens per sequence")
	gen := flag.Int("gen", 128, "decoded tokens per sequence")
	device := flag.String("device", "gpu", "MLX device: gpu or cpu")
	small := flag.Bool("small", false, "the tiny test model instead (a dry run on CPU)")
	profile := flag.String("cpuprofile", "", "directory for a Go CPU profile of each batch size's timed decode steps (cpu-bN.pprof)")
	gpuProfile := flag.Bool("gpuprofile", false, "bracket each batch size's timed decode steps with cuProfilerStart/Stop, for ncu --profile-from-start off")
	shape := flag.String("shape", "llama1b", "checkpoint shape (testmodel.Shapes)")
	quant := flag.String("quant", "", "mlx4, mlx8, or a testmodel layout (awq, gptq, fp8, fp8-channel); empty: bf16")
	fused := flag.Bool("fused", true, "the fused decode-layer kernels on a CUDA GPU (mlx.WithFusedKernels); false: the MLX ops they replace")
	flag.Parse()
	// float32 runs in float32, not TF32, unless the environment says
	// otherwise (see engine/mlx: MLX reads the variable itself).
	if _, set := os.LookupEnv("MLX_ENABLE_TF32"); !set {
		must(os.Setenv("MLX_ENABLE_TF32", "0"))
	}
	mk, ok := testmodel.Shapes()[*shape]
	if !ok {
		log.Fatalf("-shape %q: not a testmodel shape", *shape)
	}
	cfg := mk()
	if *small {
		cfg = testmodel.Tiny()
		if *quant != "" {
			cfg = testmodel.TinyQuant() // widths in groups of 128
		}
	}
	if _, err := os.Stat(filepath.Join(*dir, "config.json")); err != nil {
		must(writeCheckpoint(*dir, cfg, *quant))
	}
	sizes := ints(*batches)
	maxB := 0
	for _, b := range sizes {
		maxB = max(maxB, b)
	}
	e, err := mlx.New(mlx.WithDevice(*device), mlx.WithMaxBatch(maxB), mlx.WithFusedKernels(*fused))
	must(err)
	defer e.Close()
	ctx := context.Background()
	t0 := time.Now()
	m, err := e.Load(ctx, engine.ModelSpec{ID: "llama1b", Path: *dir, ContextLength: 1024, MaxBatch: maxB})
	must(err)
	defer m.Close()
	fmt.Printf("loaded in %v: %+v\n", time.Since(t0).Round(time.Millisecond), m.Info())
	if w, ok := m.(engine.Warmer); ok {
		t0 = time.Now()
		bs, err := w.Warm(ctx)
		must(err)
		fmt.Printf("warmed batch sizes %v in %v\n", bs, time.Since(t0).Round(time.Millisecond))
	}
	fmt.Printf("\nMLX engine decode (%s): prompt %d, %d new tokens, greedy, %s, weights %q\n", *device, *prompt, *gen, cfg.DType, *quant)
	fmt.Println("| batch | prefill s | decode tok/s | ms/step | primitives/step | per layer |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, b := range sizes {
		decode(ctx, m, b, *prompt, 8, "", false) // warm-up of this shape
		pre, tps := decode(ctx, m, b, *prompt, *gen, profileTo(*profile, b), gpuProfiler(*gpuProfile))
		step, layer := primitives(m)
		fmt.Printf("| %d | %.3f | %.1f | %.2f | %s | %s |\n", b, pre.Seconds(), tps, 1000*float64(b)/tps, step, layer)
	}
}

// writeCheckpoint writes cfg into dir in the layout quant names.
func writeCheckpoint(dir string, cfg testmodel.Config, quant string) error {
	bits := map[string]int{"mlx4": 4, "mlx8": 8}[quant]
	if bits == 0 {
		cfg.Quant = quant
		return testmodel.Write(dir, cfg)
	}
	src := dir + "-bf16"
	if err := testmodel.Write(src, cfg); err != nil {
		return err
	}
	defer os.RemoveAll(src)
	e, err := mlx.New()
	if err != nil {
		return err
	}
	defer e.Close()
	return e.Quantize(context.Background(), src, dir, bits, 64)
}

// primitives is the MLX primitives of m's last step (a decode step after
// decode), whole and per decoder layer; "?" when m does not count them.
func primitives(m engine.Model) (step, layer string) {
	pc, ok := m.(interface{ Primitives() mlx.PrimitiveCount })
	if !ok {
		return "?", "?"
	}
	c := pc.Primitives()
	return strconv.Itoa(c.Step), strconv.FormatFloat(c.PerLayer(), 'f', 1, 64)
}

// profileTo is the CPU profile file of batch size b under dir; "" when
// dir is.
func profileTo(dir string, b int) string {
	if dir == "" {
		return ""
	}
	must(os.MkdirAll(dir, 0o755))
	return filepath.Join(dir, fmt.Sprintf("cpu-b%d.pprof", b))
}

// decode opens b sequences, prefills them in one step and times n decode
// steps of the whole batch, writing a CPU profile of those steps to
// profile unless it is "" and bracketing them for gpu; it returns the
// prefill time and decode tokens/s.
func decode(ctx context.Context, m engine.Model, b, promptLen, n int, profile string, gpu gpuProfiler) (time.Duration, float64) {
	vocab := m.Info().VocabSize
	batch := make([]engine.StepInput, b)
	p := &engine.SamplingParams{}
	for i := range batch {
		toks := make([]int32, promptLen)
		for j := range toks {
			toks[j] = int32((i*7919 + j*104729) % min(120000, vocab))
		}
		id := engine.SeqID(i + 1)
		_, err := m.Open(ctx, id, toks, "")
		must(err)
		batch[i] = engine.StepInput{Seq: id, Tokens: toks, Sample: true, Params: p}
	}
	step := func() {
		outs, err := m.Step(ctx, batch)
		must(err)
		for i := range batch {
			batch[i].Tokens = []int32{outs[i].Token}
		}
	}
	t0 := time.Now()
	step()
	pre := time.Since(t0)
	if profile != "" {
		f, err := os.Create(profile)
		must(err)
		defer f.Close()
		must(pprof.StartCPUProfile(f))
	}
	gpu.start()
	t0 = time.Now()
	for range n {
		step()
	}
	el := time.Since(t0)
	gpu.stop()
	if profile != "" {
		pprof.StopCPUProfile()
	}
	for i := range batch {
		m.Free(batch[i].Seq, "")
	}
	return pre, float64(b*n) / el.Seconds()
}

func ints(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(f)
		must(err)
		out = append(out, n)
	}
	return out
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// Command gpubench measures the pyproc engine on a GPU and puts it next to
// Hugging Face transformers in the same run, on a Llama-3.2-1B-shaped
// random checkpoint: decode tokens/s at several batch sizes for the engine
// driven directly and through mlxserving.Server, transformers' generate
// with a static cache and torch.compile, and plain generate; prefill
// tokens/s for whole prompts. Each figure is set against its bound
// (weights read once per decode step at the device's bandwidth; matrix
// FLOPs at its bf16 rate). It also checks the runtime's greedy tokens and
// log-probabilities against transformers. Beside each decode figure (and
// under each serving load) it prints the GPU's mean SM and memory clocks,
// power and throttle reasons through the run, from nvidia-smi (smi.go):
// one binary has run 40% slower on one GPU than on another of its kind.
//
//	gpubench -python python3 -dir /tmp/llama1b -batches 1,8,32,64 -prefill 1x2048,16x512
//
// With -serving it measures the stack as a user runs it instead:
// examples/server on the checkpoint at its own full context (131,072
// tokens; nothing overridden), driven over HTTP by cmd/loadgen at several
// loads (closed loops and Poisson arrivals), printing per load the request
// and token throughput, TTFT and TPOT percentiles, goodput against SLOs,
// and the server's mean running batch and queue wait from its /metrics:
//
//	gpubench -serving -shape llama8b -dir /tmp/llama8b -server bin/server -loadgen bin/loadgen
//
// Where the GPU idles under a load: pass the server -trace-dir DIR after
// -- (with -trace-skip past the load's warm-up); each worker writes a
// device trace of its steps there and a summary of its idle gaps and what
// the worker did in them (pyproc.Tuning.TraceDir), which gpubench prints
// under the load's row:
//
//	gpubench -serving -shape llama1b -dir /tmp/llama1b -server bin/server -loadgen bin/loadgen -loads c256:1024 -- -trace-dir /tmp/trace -trace-skip 200
//
// With -quant it measures a quantized checkpoint of the shape instead
// (testmodel's layouts: fp8, fp8-channel, awq, gptq, written into -dir; or
// quantize-fp8: the bf16 checkpoint loaded with pyproc.WithQuantize), the
// decode bound taken from the engine's reported weight bytes:
//
//	gpubench -shape llama8b -quant awq -dir /tmp/llama8b-awq -batches 1,64 -prefill "" -hf=false -hfstatic=false -stack=false
//
// With -kv-cache-dtype fp8 the engine's KV pool is float8 e4m3
// (pyproc.WithKVCacheDtype): a decode step reads half the KV bytes; in
// serving mode pass it to the server after -- to see the pool hold twice
// the tokens (BENCHMARKS.md, "Quantized checkpoints").
//
// With -adapters N it measures LoRA serving instead (adapters.go): N
// random rank -adapter-rank adapters written beside -dir, decode tokens/s
// per batch size for the base alone, every sequence on one adapter, and
// the batch spread over the N; the time an open takes to load an adapter
// into a slot; and the greedy tokens of an adapter against the
// checkpoint with it merged (bf16: the first position they differ):
//
//	gpubench -dir /tmp/llama1b -adapters 8 -adapter-rank 16 -batches 1,16,64
//
// With -tp N it compares tensor parallel over N GPUs with one GPU on the
// checkpoint (tp.sh runs it): greedy tokens (the first position where
// they part), then decode tok/s per batch size, alternating:
//
//	gpubench -shape llama8b -dir /tmp/llama8b -tp 2 -batches 1,64
//
// ab.sh runs the decode microbenchmark under two or more worker
// environments (the runtime's MLXSERVING_* measurement switches), one
// binary, alternating, and prints each variant's mean against the first:
// a before/after from one device call. With -small -device cpu -hf=false
// -hfstatic=false the program runs on a CPU without transformers (a dry
// run of a script).
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/pyproc"
	"github.com/mlxserving/mlxserving/testmodel"
)

var (
	python      = flag.String("python", "python3", "interpreter with torch (CUDA) and transformers")
	dir         = flag.String("dir", "/tmp/llama1b", "checkpoint directory; written if missing")
	batches     = flag.String("batches", "1,8,32,64", "decode batch sizes")
	prefills    = flag.String("prefill", "1x2048,16x512", "prefill cases, BATCHxTOKENS; empty: none")
	prefillLast = flag.Bool("prefill-last", true, "prefill steps' inputs sample their sequences' last token (engine.StepInput.Last), as a request of one token does: no decode step is speculated behind each; false: one is, as behind a served prompt whose request goes on")
	prompt      = flag.Int("prompt", 128, "prompt tokens per sequence (decode)")
	gen         = flag.Int("gen", 128, "decoded tokens per sequence")
	hf          = flag.Bool("hf", true, "run transformers (plain generate, prefill) and the logits check")
	hfStatic    = flag.Bool("hfstatic", true, "run transformers' generate with a static cache and torch.compile")
	graphs      = flag.Bool("graphs", true, "CUDA graphs for decode steps")
	kernels     = flag.Bool("kernels", true, "the runtime's Triton kernels (pyproc.Tuning.NoKernels)")
	overlap     = flag.Bool("overlap", true, "the next decode step launched behind each step (pyproc.Tuning.NoOverlap)")
	prefillG    = flag.Bool("prefill-graphs", true, "steps of prompt chunks on CUDA graphs (pyproc.Tuning.NoPrefillGraphs)")
	promptAtt   = flag.Bool("prompt-attention", true, "prompt-step graphs of the whole step around the paged prompt-attention kernel (pyproc.Tuning.NoPromptAttention)")
	tpGraphs    = flag.Bool("tp-graphs", true, "CUDA graphs under tensor parallel (pyproc.Tuning.NoTPGraphs)")
	tpOneShot   = flag.Bool("tp-oneshot", true, "small tensor-parallel all-reduces over peer memory, not NCCL (pyproc.Tuning.NoOneShotAllReduce)")
	scaledMM    = flag.Bool("fp8-scaled-mm", true, "FP8 projections as W8A8 in products of 2 rows or more: a Triton kernel to 64 rows, torch._scaled_mm beyond (pyproc.Tuning.NoFP8ScaledMM)")
	lookahead   = flag.Int("lookahead", 0, "pyproc.WithLookahead (0: the engine's default)")
	kvDtype     = flag.String("kv-cache-dtype", "auto", "pyproc.WithKVCacheDtype: auto (the model's dtype) or fp8 (float8 e4m3: twice the tokens in the KV pool)")
	script      = flag.String("script", "cmd/gpubench/hf_bench.py", "transformers script")
	device      = flag.String("device", "cuda", "torch device")
	small       = flag.Bool("small", false, "write the tiny model instead (a dry run of this program on CPU)")
	withStack   = flag.Bool("stack", true, "also measure through mlxserving.Server (scheduler, batcher)")
	shape       = flag.String("shape", "llama1b", "checkpoint shape: a testmodel.Shapes name (llama1b, llama8b, llama70b, qwen3-32b, ...; bf16, random weights)")

	serving    = flag.Bool("serving", false, "serving mode: examples/server at the checkpoint's full context, driven by cmd/loadgen")
	serverBin  = flag.String("server", "bin/server", "serving mode: the examples/server binary")
	loadgenBin = flag.String("loadgen", "bin/loadgen", "serving mode: the cmd/loadgen binary")
	loads      = flag.String("loads", "c1:50,c16:200,c64:512,c256:1024,r40:800", "serving mode: cN (closed loop, N clients) or rN (Poisson, N req/s), each :REQUESTS")
	inWords    = flag.Int("input-words", 400, "serving mode: prompt length in words")
	outTokens  = flag.Int("max-tokens", 128, "serving mode: output tokens per request")
	temp       = flag.Float64("temperature", 0, "serving mode: sampling temperature of every request (0: greedy; OpenAI clients default to 1)")
	sloTTFT    = flag.Duration("slo-ttft", 500*time.Millisecond, "serving mode: goodput SLO on time to first token")
	sloTPOT    = flag.Duration("slo-tpot", 20*time.Millisecond, "serving mode: goodput SLO on time per output token")
	ramp       = flag.Duration("ramp", 0, "serving mode: closed-loop loads start their clients evenly over this time (loadgen -ramp; 0: all at once)")
	rangeRatio = flag.Float64("range-ratio", 0, "serving mode: each request's prompt words and output tokens uniform within this fraction of -input-words and -max-tokens (loadgen -range-ratio; 0: exactly those)")
	logDir     = flag.String("logs", os.TempDir(), "serving mode: where the server's log goes")
	quantFlag  = flag.String("quant", "", "a quantized checkpoint: fp8, fp8-channel, awq, gptq (testmodel layouts) or quantize-fp8 (-quantize fp8 on the bf16 one)")
	bwFlag     = flag.Float64("bandwidth", 0, "memory bandwidth for the decode bound, bytes/s (0: the GPU's nominal figure)")
	tpFlag     = flag.Int("tp", 1, "tensor-parallel mode: this many GPUs against one (greedy tokens, then decode tok/s alternating; -batches \"\": tokens only)")
)

// tuning is the workers' tuning the flags ask for.
func tuning() pyproc.Option { return pyproc.WithTuning(tuningValue()) }

// tuningValue is the pyproc.Tuning the flags ask for.
func tuningValue() pyproc.Tuning {
	return pyproc.Tuning{NoKernels: !*kernels, NoOverlap: !*overlap, NoPrefillGraphs: !*prefillG, NoPromptAttention: !*promptAtt, NoTPGraphs: !*tpGraphs, NoOneShotAllReduce: !*tpOneShot, NoFP8ScaledMM: !*scaledMM}
}

// bf16Rate is a large bf16 matrix product's rate on the H100 as measured
// on the device machine (the H200 has the same compute).
const bf16Rate = 790e12

// nominalBandwidths are the vendors' memory bandwidths (bytes/s) by a
// part of the device name, most specific first.
var nominalBandwidths = []struct {
	name string
	bps  float64
}{
	{"H200", 4.8e12}, {"H100 NVL", 3.9e12}, {"H100 PCIe", 2.0e12}, {"H100", 3.35e12},
	{"A100-SXM4-80GB", 2.039e12}, {"A100 80GB PCIe", 1.935e12}, {"A100", 1.555e12},
	{"L40S", 0.864e12}, {"L4", 0.3e12},
}

// fallbackBandwidth is a device-to-device copy on the H100 as measured on
// the device machine, for a GPU the table does not name.
const fallbackBandwidth = 3.0e12

// bandwidthFor is the decode bound's bandwidth for the device named in
// info: -bandwidth when set, else the nominal figure of the GPU.
func bandwidthFor(info string, flagBPS float64) (float64, string) {
	if flagBPS > 0 {
		return flagBPS, "-bandwidth"
	}
	for _, b := range nominalBandwidths {
		if strings.Contains(info, b.name) {
			return b.bps, "nominal " + b.name
		}
	}
	return fallbackBandwidth, "an H100's measured copy rate (device not in the table)"
}

func main() {
	flag.Parse()
	ctx := context.Background()
	mk, ok := testmodel.Shapes()[*shape]
	if !ok {
		log.Fatalf("-shape %q: want one of %v", *shape, slices.Sorted(maps.Keys(testmodel.Shapes())))
	}
	cfg := mk()
	if *small {
		cfg = testmodel.Tiny()
	}
	var quantize []pyproc.Option
	switch q := *quantFlag; {
	case q == "quantize-fp8":
		quantize = append(quantize, pyproc.WithQuantize("fp8"))
	case q != "":
		if !slices.Contains(testmodel.Quants(), q) {
			log.Fatalf("-quant %q: want quantize-fp8 or one of %v", q, testmodel.Quants())
		}
		cfg.Quant = q
	}
	if *quantFlag != "" { // transformers' figures are the bf16 run's
		*hf, *hfStatic = false, false
	}
	if _, err := os.Stat(filepath.Join(*dir, "config.json")); err != nil {
		t0 := time.Now()
		must(testmodel.Write(*dir, cfg))
		fmt.Printf("wrote %s in %v\n", *dir, time.Since(t0).Round(time.Millisecond))
	}
	if *serving {
		must(servingMode(ctx))
		return
	}
	if *tpFlag > 1 {
		must(tpMode(ctx, *tpFlag))
		return
	}
	if *adapters > 0 { // LoRA mode: the engine alone (no transformers)
		adapterMode(ctx, cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
		return
	}
	info := strings.TrimSpace(string(run(nil, *python, *script, "info")))
	bandwidth, bwFrom := bandwidthFor(info, *bwFlag)
	fmt.Printf("device: %s\n", info)
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if *hf {
		checkTiny(ctx, logger)
	}
	sizes := ints(*batches)
	cases := parseCases(*prefills)
	e, err := pyproc.New(ctx, append([]pyproc.Option{pyproc.WithPython(*python), pyproc.WithDevice(*device), pyproc.WithLogger(logger),
		pyproc.WithCUDAGraphs(*graphs), pyproc.WithStartTimeout(5 * time.Minute), pyproc.WithLookahead(*lookahead), tuning(),
		pyproc.WithKVCacheDtype(*kvDtype)}, quantize...)...)
	must(err)
	t0 := time.Now()
	mi, err := e.Load(ctx, engine.ModelSpec{ID: "llama1b", Path: *dir, ContextLength: 1024, MaxBatch: max(64, slices.Max(append(sizes, 1)))})
	must(err)
	m := mi.(*pyproc.Model)
	fmt.Printf("loaded in %v: %+v\n", time.Since(t0).Round(time.Millisecond), m.Info())
	weights := weightBytes(cfg)
	if *quantFlag != "" && m.Info().WeightBytes > 0 {
		// What the engine holds (the quantized bytes), less an untied
		// embedding, of which a step reads a row a sequence.
		weights = float64(m.Info().WeightBytes)
		if !cfg.TieEmbeddings {
			weights -= 2 * float64(cfg.Vocab*cfg.Hidden)
		}
	}
	ours := map[int]float64{}
	for _, b := range sizes {
		decode(ctx, m, b, *gen) // warm-up: captures the graphs the timed run uses
		clocks := sampleClocks(ctx)
		ours[b] = decode(ctx, m, b, *gen)
		fmt.Printf("engine decode batch %d: %.1f tokens/s (GPU: %s)\n", b, ours[b], clocks())
	}
	must(m.Close())
	pre := map[string]float64{}
	if len(cases) > 0 {
		pre = prefillAll(ctx, e, cases)
	}
	stack := map[int]float64{}
	if *withStack {
		stack = serve(ctx, e, sizes)
	}
	must(e.Close()) // frees the GPU for transformers
	var hfGen, hfStat, hfPre map[string]float64
	if *hf {
		hfGen = runJSON(*python, *script, "bench", *dir, *batches)
		if len(cases) > 0 {
			hfPre = runJSON(*python, *script, "prefill", *dir, *prefills)
		}
	}
	if *hfStatic {
		hfStat = runJSON(*python, *script, "static", *dir, *batches)
	}
	fmt.Printf("\ndecode: prompt %d, %d new tokens, greedy, bf16 activations, weights %q; bound = batch x %.0f GB/s (%s) / %.2f GB of weights\n",
		*prompt, *gen, cmp.Or(*quantFlag, "bf16"), bandwidth/1e9, bwFrom, weights/1e9)
	if isMoE(cfg) && *quantFlag == "" {
		fmt.Println("(a mixture of experts: a step reads the experts its batch touches, on average under uniform routing, besides the rest)")
	}
	fmt.Println("| batch | engine tok/s | Server tok/s | HF static+compile tok/s | HF generate tok/s | bound tok/s | engine/bound | Server/bound | engine/HF static |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, b := range sizes {
		read := weights
		if *quantFlag == "" {
			read = stepBytes(cfg, b)
		}
		bound := float64(b) * bandwidth / read
		k := strconv.Itoa(b)
		fmt.Printf("| %d | %.1f | %.1f | %.1f | %.1f | %.0f | %.3f | %.3f | %s |\n", b, ours[b], stack[b], hfStat[k], hfGen[k],
			bound, ours[b]/bound, stack[b]/bound, ratio(ours[b], hfStat[k]))
	}
	if len(cases) > 0 {
		behind := "its token each sequence's last: no decode step speculated behind it"
		if !*prefillLast {
			behind = "a decode step speculated behind it (-prefill-last=false)"
		}
		fmt.Printf("\nprefill: one Step with every prompt whole (first token sampled; %s); bound = %.2f GFLOP/token at %.0f TFLOP/s\n",
			behind, flopsPerToken(cfg, 1024)/1e9, bf16Rate/1e12)
		fmt.Println("| prompts | engine tok/s | HF forward tok/s | bound tok/s | engine/bound |")
		fmt.Println("|---|---|---|---|---|")
		for _, c := range cases {
			bound := bf16Rate / flopsPerToken(cfg, c.n/2)
			fmt.Printf("| %s | %.0f | %.0f | %.0f | %.3f |\n", c.name, pre[c.name], hfPre[c.name], bound, pre[c.name]/bound)
		}
	}
}

// servingMode runs the serving table (serving.go) on the checkpoint in -dir.
func servingMode(ctx context.Context) error {
	if *serverBin == "" || *loadgenBin == "" {
		return errNoServer
	}
	ls, err := parseLoads(*loads)
	if err != nil {
		return err
	}
	return runServing(ctx, *dir, servingConfig{
		server: *serverBin, loadgen: *loadgenBin, python: *python, loads: ls,
		inputWords: *inWords, maxTokens: *outTokens, temperature: *temp, ttftSLO: *sloTTFT, tpotSLO: *sloTPOT, ramp: *ramp, rangeRatio: *rangeRatio,
		logDir: *logDir, serverArgs: flag.Args(),
	})
}

type prefillCase struct {
	name string
	b, n int
}

func parseCases(s string) []prefillCase {
	var cs []prefillCase
	for _, f := range strings.Split(s, ",") {
		if f == "" {
			continue
		}
		b, n, ok := strings.Cut(f, "x")
		if !ok {
			log.Fatalf("prefill case %q: want BATCHxTOKENS", f)
		}
		bi, err := strconv.Atoi(b)
		must(err)
		ni, err := strconv.Atoi(n)
		must(err)
		cs = append(cs, prefillCase{f, bi, ni})
	}
	return cs
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

// weightBytes is what a decode step reads at least: every weight once
// (the tied embedding counted once, as the output projection).
func weightBytes(c testmodel.Config) float64 {
	return 2 * (float64(c.Layers)*layerParams(c) + float64(c.Vocab*c.Hidden))
}

// layerParams is the parameters of a layer a token reads: its attention
// projections and its MLP, or for a mixture of experts the router and
// the experts active a token. At batch 1 a mixture's bound is then the
// active-parameter bound; a batch reads more experts than one token.
func layerParams(c testmodel.Config) float64 {
	hd := headSize(c)
	mlp := 3 * c.Hidden * c.Intermediate
	if isMoE(c) {
		E, k, w := expertShape(c)
		mlp = k*3*c.Hidden*w + c.Hidden*E
	}
	return float64(c.Hidden*(c.Heads+2*c.KVHeads)*hd + c.Heads*hd*c.Hidden + mlp)
}

// stepBytes is what a decode step of batch sequences reads at least:
// weightBytes, but for a mixture of experts the experts a batch touches
// on average when each token's k of E experts are uniform and
// independent, E * (1 - (1 - k/E)^batch) a layer, not k.
func stepBytes(c testmodel.Config, batch int) float64 {
	if !isMoE(c) {
		return weightBytes(c)
	}
	E, k, w := expertShape(c)
	expert := 2 * 3 * float64(c.Hidden*w) // bf16 bytes of one expert
	touched := float64(E) * (1 - math.Pow(1-float64(k)/float64(E), float64(batch)))
	return weightBytes(c) + float64(c.Layers)*(touched-float64(k))*expert
}

func isMoE(c testmodel.Config) bool { return c.Arch == "qwen3_moe" || c.Arch == "mixtral" }

// expertShape is a mixture's experts, top k and expert width, with
// testmodel's zero values.
func expertShape(c testmodel.Config) (experts, k, width int) {
	width = c.Intermediate // mixtral's experts
	if c.Arch == "qwen3_moe" {
		width = cmp.Or(c.ExpertIntermediate, c.Intermediate/2)
	}
	return cmp.Or(c.Experts, 4), cmp.Or(c.ExpertsPerToken, 2), width
}

func headSize(c testmodel.Config) int {
	if c.HeadSize > 0 {
		return c.HeadSize
	}
	return c.Hidden / c.Heads
}

// flopsPerToken is a prefill token's matrix work at average attention
// length ctx: the layers' projections and attention (the output
// projection runs for the last token only).
func flopsPerToken(c testmodel.Config, ctx int) float64 {
	hd := headSize(c)
	return float64(c.Layers) * (2*layerParams(c) + 4*float64(ctx*c.Heads*hd))
}

func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

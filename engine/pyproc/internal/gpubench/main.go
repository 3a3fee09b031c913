// Command gpubench measures the pyproc engine on a GPU: decode tokens/s
// at several batch sizes on a Llama-3.2-1B-shaped random checkpoint, next
// to transformers' generate in the same run, and checks the runtime's
// greedy tokens and log-probabilities against transformers.
//
//	gpubench -python python3 -dir /tmp/llama1b -batches 1,8,32,64
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/pyproc"
	"github.com/mlxserving/mlxserving/internal/testmodel"
)

var (
	python    = flag.String("python", "python3", "interpreter with torch (CUDA) and transformers")
	dir       = flag.String("dir", "/tmp/llama1b", "checkpoint directory; written if missing")
	batches   = flag.String("batches", "1,8,32,64", "batch sizes")
	prompt    = flag.Int("prompt", 128, "prompt tokens per sequence")
	gen       = flag.Int("gen", 128, "decoded tokens per sequence")
	hf        = flag.Bool("hf", true, "run transformers' generate and the logits check")
	graphs    = flag.Bool("graphs", true, "CUDA graphs for decode steps")
	script    = flag.String("script", "engine/pyproc/testdata/hf_bench.py", "transformers script")
	device    = flag.String("device", "cuda", "torch device")
	small     = flag.Bool("small", false, "write the tiny model instead (a dry run of this program on CPU)")
	withStack = flag.Bool("stack", true, "also measure through mlxserving.Server (scheduler, batcher)")
)

func main() {
	flag.Parse()
	ctx := context.Background()
	if _, err := os.Stat(filepath.Join(*dir, "config.json")); err != nil {
		t0 := time.Now()
		cfg := testmodel.Llama1B()
		if *small {
			cfg = testmodel.Tiny()
		}
		must(testmodel.Write(*dir, cfg))
		fmt.Printf("wrote %s in %v\n", *dir, time.Since(t0).Round(time.Millisecond))
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if *hf {
		checkTiny(ctx, logger)
	}
	e, err := pyproc.New(ctx, pyproc.WithPython(*python), pyproc.WithDevice(*device), pyproc.WithLogger(logger),
		pyproc.WithCUDAGraphs(*graphs), pyproc.WithStartTimeout(5*time.Minute))
	must(err)
	defer e.Close()
	t0 := time.Now()
	mi, err := e.Load(ctx, engine.ModelSpec{ID: "llama1b", Path: *dir, ContextLength: 1024, MaxBatch: 64})
	must(err)
	m := mi.(*pyproc.Model)
	fmt.Printf("loaded in %v: %+v\n", time.Since(t0).Round(time.Millisecond), m.Info())
	var sizes []int
	for _, s := range strings.Split(*batches, ",") {
		n, err := strconv.Atoi(s)
		must(err)
		sizes = append(sizes, n)
	}
	ours := map[int]float64{}
	for _, b := range sizes {
		decode(ctx, m, b, *gen) // warm-up: captures the graphs of every length bucket the timed run uses
		ours[b] = decode(ctx, m, b, *gen)
		fmt.Printf("pyproc batch %d: %.1f tokens/s\n", b, ours[b])
	}
	must(m.Close())
	stack := map[int]float64{}
	if *withStack {
		stack = serve(ctx, e, sizes)
	}
	theirs := map[string]float64{}
	if *hf {
		out := run(nil, *python, *script, "bench", *dir, *batches)
		must(json.Unmarshal(out, &theirs))
	}
	// Bandwidth bound: every decode step reads the weights once.
	const weightBytes, bandwidth = 2.47e9, 3.0e12
	fmt.Println("batch | engine tok/s | Server tok/s | generate tok/s | bound tok/s | engine/bound | Server/bound")
	for _, b := range sizes {
		bound := float64(b) * bandwidth / weightBytes
		fmt.Printf("%5d | %12.1f | %12.1f | %14.1f | %11.0f | %12.3f | %.3f\n",
			b, ours[b], stack[b], theirs[strconv.Itoa(b)], bound, ours[b]/bound, stack[b]/bound)
	}
}

// decode opens b sequences, prefills them in one step and times n decode
// steps; it returns decode tokens/s.
func decode(ctx context.Context, m *pyproc.Model, b, n int) float64 {
	batch := make([]engine.StepInput, b)
	p := &engine.SamplingParams{}
	for i := range batch {
		toks := make([]int32, *prompt)
		for j := range toks {
			toks[j] = int32((i*7919 + j*104729) % min(120000, m.Info().VocabSize))
		}
		_, err := m.Open(ctx, engine.SeqID(i+1), toks, "")
		must(err)
		batch[i] = engine.StepInput{Seq: engine.SeqID(i + 1), Tokens: toks, Sample: true, Params: p}
	}
	step := func() {
		outs, err := m.Step(ctx, batch)
		must(err)
		for i := range batch {
			batch[i].Tokens = []int32{outs[i].Token}
		}
	}
	step()
	t0 := time.Now()
	for range n {
		step()
	}
	el := time.Since(t0)
	for i := range batch {
		m.Free(batch[i].Seq, "")
	}
	return float64(b*n) / el.Seconds()
}

// checkTiny compares greedy tokens and logprobs with transformers on a tiny
// float32 checkpoint (llama3 rope scaling, tied embeddings).
func checkTiny(ctx context.Context, logger *slog.Logger) {
	e, err := pyproc.New(ctx, pyproc.WithPython(*python), pyproc.WithDevice(*device), pyproc.WithDType("float32"),
		pyproc.WithLogger(logger), pyproc.WithStartTimeout(5*time.Minute))
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
	agree, total, maxDiff := 0, 0, 0.0
	for i, p := range prompts {
		_, err := mi.Open(ctx, engine.SeqID(i+1), p, "")
		must(err)
		feed := p
		for k := 0; k < n; k++ {
			outs, err := mi.Step(ctx, []engine.StepInput{{Seq: engine.SeqID(i + 1), Tokens: feed, Sample: true, Params: &engine.SamplingParams{Logprobs: true}}})
			must(err)
			total++
			if outs[0].Token == ref[i].Tokens[k] {
				agree++
			}
			maxDiff = math.Max(maxDiff, math.Abs(float64(outs[0].Logprob)-ref[i].Logprobs[k]))
			feed = []int32{ref[i].Tokens[k]} // teacher-force the reference's tokens
		}
		mi.Free(engine.SeqID(i+1), "")
	}
	fmt.Printf("vs transformers (tiny float32, llama3 scaling, tied): %d/%d greedy tokens agree, max |logprob diff| %.2g\n",
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

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// serve measures decode tokens/s through mlxserving.Server: b concurrent
// requests of the same shape as decode's, timed from the moment every
// stream has its first token to the last token.
func serve(ctx context.Context, e *pyproc.Engine, sizes []int) map[int]float64 {
	srv, err := mlxserving.New(e, mlxserving.WithBatcherOptions(batcher.WithMaxBatch(64), batcher.WithTokenBudget(64**prompt)))
	must(err)
	defer srv.Close()
	must(srv.LoadModel(ctx, engine.ModelSpec{ID: "served", Path: *dir, ContextLength: 1024, MaxBatch: 64}))
	vocab := srv.Models()[0].VocabSize
	res := map[int]float64{}
	for _, b := range sizes {
		serveOnce(ctx, srv, b, vocab) // warm-up
		res[b] = serveOnce(ctx, srv, b, vocab)
		fmt.Printf("Server batch %d: %.1f tokens/s\n", b, res[b])
	}
	return res
}

func serveOnce(ctx context.Context, srv *mlxserving.Server, b, vocab int) float64 {
	stamps := make([][]time.Time, b) // when each stream got each token
	var wg sync.WaitGroup
	for i := range b {
		toks := make([]int32, *prompt)
		for j := range toks {
			toks[j] = int32((i*7919 + j*104729) % min(120000, vocab))
		}
		st, err := srv.Generate(ctx, api.Request{Model: "served", PromptTokens: toks,
			Params: api.Params{MaxTokens: *gen, IgnoreEOS: true}})
		must(err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c, err := range st.Chunks() {
				must(err)
				if c.HasToken {
					stamps[i] = append(stamps[i], time.Now())
				}
			}
		}()
	}
	wg.Wait()
	// The window: from the moment every stream has its first token (all
	// are decoding) to the last token; count the tokens inside it.
	start, end := stamps[0][0], stamps[0][len(stamps[0])-1]
	for _, s := range stamps {
		start = later(start, s[0])
		end = later(end, s[len(s)-1])
	}
	n := 0
	for _, s := range stamps {
		for _, t := range s {
			if t.After(start) {
				n++
			}
		}
	}
	return float64(n) / end.Sub(start).Seconds()
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

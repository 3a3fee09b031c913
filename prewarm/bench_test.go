package prewarm_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/pyproc"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/testmodel"
)

// The benchmarks run the Python engine's torch backend on CPU with the
// project's generated test model (testmodel.Tiny) and report
// latencies as custom metrics; ns/op is the whole iteration, engine start
// included, and means little. They skip without MLXSERVING_PYTHON
// (scripts/setup.d/30-python.sh).

func benchEngine(b *testing.B, opts ...mlxserving.Option) (*pyproc.Engine, *mlxserving.Server, func()) {
	b.Helper()
	py := os.Getenv("MLXSERVING_PYTHON")
	if py == "" {
		b.Skip("MLXSERVING_PYTHON is not set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eng, err := pyproc.New(ctx, pyproc.WithPython(py), pyproc.WithCacheDir(benchCache), pyproc.WithDevice(*benchDevice), pyproc.WithThreads(1))
	if err != nil {
		b.Fatal(err)
	}
	srv, err := mlxserving.New(eng, opts...)
	if err != nil {
		b.Fatal(err)
	}
	return eng, srv, func() { _ = srv.Close(); _ = eng.Close() }
}

// benchDevice picks the torch device: go test -bench . ./prewarm -args -device cuda
var benchDevice = flag.String("device", "cpu", "torch device of the benchmarks' Python engine: cpu or cuda")

var (
	benchCache = os.TempDir() + "/mlxserving-prewarm-bench"
	benchOnce  sync.Once
	benchDirs  []string
)

// benchModels writes n test checkpoints (different seeds) once.
func benchModels(b *testing.B, n int) []string {
	benchOnce.Do(func() {
		for i := range 3 {
			dir, err := os.MkdirTemp("", "prewarm-bench-")
			if err == nil {
				cfg := testmodel.Tiny()
				cfg.Seed = int64(i + 1)
				err = testmodel.Write(dir, cfg)
			}
			if err != nil {
				panic(err)
			}
			benchDirs = append(benchDirs, dir)
		}
	})
	return benchDirs[:n]
}

const benchPrompt = "Hello! Who are you?"

// ttft sends one chat-free completion and returns the time to its first
// token, measured by the caller around the whole request (load included).
func ttft(b *testing.B, srv *mlxserving.Server, id string, maxTokens int) (first, total time.Duration) {
	b.Helper()
	start := time.Now()
	st, err := srv.Generate(context.Background(), api.Request{Model: id, Prompt: benchPrompt, Params: api.Params{MaxTokens: maxTokens, IgnoreEOS: true}})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	for c, err := range st.Chunks() {
		if err != nil {
			b.Fatal(err)
		}
		if c.HasToken && first == 0 {
			first = time.Since(start)
		}
	}
	return first, time.Since(start)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkFirstRequestTTFT measures the first request's time to first
// token on a fresh engine process: cold (the model registered, loaded by
// the request), loaded (LoadModel, no warm-up) and pre-warmed (PreWarmer
// ready first). Each iteration starts a new worker process.
func BenchmarkFirstRequestTTFT(b *testing.B) {
	dir := benchModels(b, 1)[0]
	model := prewarm.Model{Spec: engine.ModelSpec{ID: "m", Path: dir}, Prompts: []string{benchPrompt}}
	for _, mode := range []string{"cold", "loaded", "prewarmed"} {
		b.Run(mode, func(b *testing.B) {
			var sum time.Duration
			for range b.N {
				_, srv, done := benchEngine(b)
				switch mode {
				case "cold":
					if err := srv.RegisterModel(model); err != nil {
						b.Fatal(err)
					}
				case "loaded":
					if err := srv.LoadModel(context.Background(), model.Spec); err != nil {
						b.Fatal(err)
					}
				case "prewarmed":
					pw, err := prewarm.New(srv, []prewarm.Model{model})
					if err != nil {
						b.Fatal(err)
					}
					_ = pw.Start(context.Background())
					if err := pw.Ready(context.Background()); err != nil {
						b.Fatal(err)
					}
					pw.Stop()
				}
				first, _ := ttft(b, srv, "m", 4)
				sum += first
				done()
			}
			b.ReportMetric(ms(sum)/float64(b.N), "ttft-ms")
		})
	}
}

// BenchmarkConcurrentFirstRequests sends 64 requests at once for a
// registered, unloaded model: one load serves them all.
func BenchmarkConcurrentFirstRequests(b *testing.B) {
	dir := benchModels(b, 1)[0]
	var all []time.Duration
	loads := 0
	for range b.N {
		_, srv, done := benchEngine(b)
		if err := srv.RegisterModel(prewarm.Model{Spec: engine.ModelSpec{ID: "m", Path: dir}}); err != nil {
			b.Fatal(err)
		}
		firsts := make([]time.Duration, 64)
		var wg sync.WaitGroup
		for i := range firsts {
			wg.Add(1)
			go func() { defer wg.Done(); firsts[i], _ = ttft(b, srv, "m", 4) }()
		}
		wg.Wait()
		for _, st := range srv.ModelStatus() {
			loads += st.Loads
		}
		all = append(all, firsts...)
		done()
	}
	slices.Sort(all)
	q := func(p float64) float64 { return ms(all[int(p*float64(len(all)-1))]) }
	b.ReportMetric(float64(loads)/float64(b.N), "loads/64req")
	b.ReportMetric(q(0), "ttft-min-ms")
	b.ReportMetric(q(0.5), "ttft-p50-ms")
	b.ReportMetric(q(0.99), "ttft-p99-ms")
	b.ReportMetric(q(1), "ttft-max-ms")
}

// BenchmarkModelSwitch runs sequential requests (8 tokens each) on one
// model and alternating between two loaded models, in interleaved blocks;
// the difference of the median latencies is the cost of switching.
func BenchmarkModelSwitch(b *testing.B) {
	dirs := benchModels(b, 2)
	_, srv, done := benchEngine(b)
	defer done()
	for i, dir := range dirs {
		pw, _ := prewarm.New(srv, []prewarm.Model{{Spec: engine.ModelSpec{ID: fmt.Sprint("m", i), Path: dir}}})
		_ = pw.Start(context.Background())
		if err := pw.Ready(context.Background()); err != nil {
			b.Fatal(err)
		}
		pw.Stop()
	}
	const block = 20
	var oneF, oneT, altF, altT []time.Duration
	run := func(firsts, totals *[]time.Duration, ids ...string) {
		for i := range block {
			first, total := ttft(b, srv, ids[i%len(ids)], 8)
			*firsts, *totals = append(*firsts, first), append(*totals, total)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			run(&oneF, &oneT, "m0")
			run(&altF, &altT, "m0", "m1")
		} else {
			run(&altF, &altT, "m0", "m1")
			run(&oneF, &oneT, "m0")
		}
	}
	p50 := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	b.ReportMetric(ms(p50(oneF)), "one-ttft-p50-ms")
	b.ReportMetric(ms(p50(altF)), "alt-ttft-p50-ms")
	b.ReportMetric(ms(p50(oneT)), "one-req-p50-ms")
	b.ReportMetric(ms(p50(altT)), "alt-req-p50-ms")
	b.ReportMetric(ms(p50(altT)-p50(oneT)), "switch-ms")
}

// BenchmarkRoundRobinUnderBudget sends requests to three models in turn
// under a memory budget that holds two: every request after the first two
// evicts the least recently used model and loads its own.
func BenchmarkRoundRobinUnderBudget(b *testing.B) {
	dirs := benchModels(b, 3)
	var perModel int64
	{ // one load to learn the engine's report of a model's memory
		_, srv, done := benchEngine(b)
		if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "probe", Path: dirs[0]}); err != nil {
			b.Fatal(err)
		}
		perModel = srv.Models()[0].MemoryBytes()
		done()
	}
	const requests = 30
	var lat []time.Duration
	var evictions, failed int
	for range b.N {
		_, srv, done := benchEngine(b, mlxserving.WithMemoryBudget(perModel*5/2))
		for i, dir := range dirs {
			if err := srv.RegisterModel(prewarm.Model{Spec: engine.ModelSpec{ID: fmt.Sprint("m", i), Path: dir}}); err != nil {
				b.Fatal(err)
			}
		}
		for i := range requests {
			start := time.Now()
			st, err := srv.Generate(context.Background(), api.Request{Model: fmt.Sprint("m", i%3), Prompt: benchPrompt, Params: api.Params{MaxTokens: 8, IgnoreEOS: true}})
			if err == nil {
				_, err = st.Collect()
			}
			if err != nil {
				failed++
				b.Logf("request %d: %v", i, err)
				continue
			}
			lat = append(lat, time.Since(start))
			if used, budget := srv.Memory(); used > budget {
				b.Fatalf("memory %d over the budget %d", used, budget)
			}
		}
		for _, st := range srv.ModelStatus() {
			evictions += st.Evictions
		}
		done()
	}
	slices.Sort(lat)
	b.ReportMetric(float64(perModel)/1e6, "model-MB")
	b.ReportMetric(float64(failed), "failed")
	b.ReportMetric(float64(evictions)/float64(b.N), "evictions/30req")
	b.ReportMetric(ms(lat[len(lat)/2]), "req-p50-ms")
	b.ReportMetric(ms(lat[len(lat)-1]), "req-max-ms")
}

package pyproc

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// BenchmarkEmptyStepRoundTrip measures the protocol's own cost: a step
// request with an empty batch, to the worker and back.
func BenchmarkEmptyStepRoundTrip(b *testing.B) {
	e := newEngine(b)
	m := load(b, e, tiny(b))
	p, err := e.slots[0].current(context.Background(), e.closing)
	if err != nil {
		b.Fatal(err)
	}
	empty := func(buf []byte, id uint64) []byte { return appendStep(buf, id, m.handle, 0, nil, nil, nil, 0) }
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.call(ctx, "tiny", empty); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecode compares decoding 16 sequences together (one Step carries
// all 16) with decoding them one at a time, on the tiny model; tokens/s is
// the figure to compare.
func BenchmarkDecode(b *testing.B) {
	for _, bc := range []struct {
		name     string
		together int
	}{{"one_at_a_time", 1}, {"batch16", 16}} {
		b.Run(bc.name, func(b *testing.B) {
			e := newEngine(b)
			m := load(b, e, tiny(b))
			const seqs, steps = 16, 32
			tokens := 0
			for b.Loop() {
				for g := 0; g < seqs; g += bc.together {
					tokens += decodeGroup(b, m, g, bc.together, steps)
				}
			}
			b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// decodeGroup opens n sequences with 16-token prompts, prefills them and
// decodes steps tokens each, all n in every Step.
func decodeGroup(b *testing.B, m *Model, first, n, steps int) int {
	ctx := context.Background()
	batch := make([]engine.StepInput, n)
	for i := range batch {
		id := engine.SeqID(first + i + 1)
		p := prompt(first+i, 16)
		batch[i] = engine.StepInput{Seq: id, Tokens: openFeed(b, m, id, p), Sample: true, Params: greedy}
	}
	for range steps {
		outs, err := m.Step(ctx, batch)
		if err != nil {
			b.Fatal(err)
		}
		for i := range batch {
			batch[i].Tokens = []int32{outs[i].Token}
		}
	}
	for i := range batch {
		m.Free(batch[i].Seq, "")
	}
	return n * steps
}

// BenchmarkServe is the same comparison through the whole stack
// (mlxserving.Server: scheduler, continuous batcher, pyproc): 16 requests
// at once versus the same 16 one after another.
func BenchmarkServe(b *testing.B) {
	for _, bc := range []struct {
		name       string
		concurrent bool
	}{{"one_at_a_time", false}, {"concurrent16", true}} {
		b.Run(bc.name, func(b *testing.B) {
			e := newEngine(b)
			srv, err := mlxserving.New(e)
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			ctx := context.Background()
			if err := srv.LoadModel(ctx, engine.ModelSpec{ID: "tiny", Path: tiny(b)}); err != nil {
				b.Fatal(err)
			}
			tokens := 0
			for b.Loop() {
				tokens += serveAll(b, srv, "tiny", 16, api.Params{MaxTokens: 32, IgnoreEOS: true}, bc.concurrent)
			}
			b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// serveAll generates n requests with params p on model (prompts of 16
// tokens), at once or one after another, and returns their tokens.
func serveAll(b *testing.B, srv *mlxserving.Server, model string, n int, p api.Params, concurrent bool) int {
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	one := func(i int) {
		defer wg.Done()
		st, err := srv.Generate(context.Background(), api.Request{Model: model, PromptTokens: prompt(i, 16), Params: p})
		if err != nil {
			b.Error(err)
			return
		}
		res, err := st.Collect()
		if err != nil {
			b.Error(err)
		}
		mu.Lock()
		total += len(res.Tokens)
		mu.Unlock()
	}
	for i := range n {
		wg.Add(1)
		if concurrent {
			go one(i)
		} else {
			one(i)
		}
	}
	wg.Wait()
	return total
}

// BenchmarkWorkerHostStep measures the worker's host time a step of 220
// rows on the CUDA path, emulated on the CPU (testdata/host_step_bench.py:
// the protocol, TorchModel.step, the speculated step behind it and the
// sampling bookkeeping, the device's work taken out), for decode steps
// and for mixed ones (a prompt chunk beside the decodes, a sequence
// leaving and one joining), greedy and sampled. That time is what the GPU
// waits behind when it exceeds a step's device time. prompt/2048 is a
// lone 2,048-token prompt's step (open, the whole prompt, free): the host
// work before its launch is what its first token waits for.
func BenchmarkWorkerHostStep(b *testing.B) {
	py := python(b)
	dir := tiny(b)
	for _, mix := range []string{"decode", "mixed"} {
		for _, params := range []string{"greedy", "sampled"} {
			b.Run(mix+"/"+params, func(b *testing.B) {
				for b.Loop() {
					ms, perRow := hostStep(b, py, dir, 220, 300, params, mix)
					b.ReportMetric(ms, "host-ms/step")
					b.ReportMetric(perRow, "host-µs/row")
				}
			})
		}
	}
	b.Run("prompt/2048", func(b *testing.B) {
		long := testmodel.Tiny() // its context (512) is shorter than the prompt
		long.ContextLength = 4096
		dir := b.TempDir()
		if err := testmodel.Write(dir, long); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			ms, perToken := hostStep(b, py, dir, 2048, 200, "greedy", "prompt")
			b.ReportMetric(ms, "host-ms/step")
			b.ReportMetric(perToken, "host-µs/token")
		}
	})
}

// hostStep runs testdata/host_step_bench.py (params: greedy or sampled;
// mix: decode, mixed or prompt, where rows is the prompt's tokens) and
// returns its median host milliseconds a step and microseconds a row (a
// prompt token).
func hostStep(tb testing.TB, py, dir string, rows, steps int, params, mix string) (ms, perRow float64) {
	tb.Helper()
	out, err := exec.Command(py, "testdata/host_step_bench.py", "runtime", dir, strconv.Itoa(rows), strconv.Itoa(steps), params, mix).CombinedOutput()
	if err != nil {
		tb.Fatalf("host_step_bench.py: %v\n%s", err, out)
	}
	line := strings.TrimSpace(string(out))
	var mean float64
	if _, err := fmt.Sscanf(line, "host ms a step: median %f mean %f", &ms, &mean); err != nil {
		tb.Fatalf("host_step_bench.py printed %q: %v", out, err)
	}
	i := strings.LastIndex(line, "; ")
	if i < 0 {
		tb.Fatalf("host_step_bench.py printed %q: no time a row", out)
	}
	if _, err := fmt.Sscanf(line[i+2:], "%f us a", &perRow); err != nil {
		tb.Fatalf("host_step_bench.py printed %q: %v", out, err)
	}
	return ms, perRow
}

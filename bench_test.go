package mlxserving_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/scheduler"
)

// These benchmarks measure the serving layer on the simulated engine, whose
// steps sleep for a fixed time: what they report is the stack's own cost.
// Run them one at a time with -benchtime=1x; see BENCHMARKS.md.

func simServer(tb testing.TB, step time.Duration, maxBatch int, opts ...mlxserving.Option) *mlxserving.Server {
	srv, _ := simServerAndEngine(tb, step, maxBatch, opts...)
	return srv
}

func simServerAndEngine(tb testing.TB, step time.Duration, maxBatch int, opts ...mlxserving.Option) (*mlxserving.Server, *enginetest.Sim) {
	tb.Helper()
	sim, err := enginetest.NewSim(enginetest.WithStepTime(step, 0), enginetest.WithMaxBatch(maxBatch),
		enginetest.WithVocabSize(32000), enginetest.WithContextLength(4096))
	if err != nil {
		tb.Fatal(err)
	}
	srv, err := mlxserving.New(sim, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "sim"}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = srv.Close()
		_ = sim.Close()
	})
	return srv, sim
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// generate runs one request to its end, reporting failures on tb.
func generate(tb testing.TB, srv *mlxserving.Server, r api.Request) (api.Result, bool) {
	st, err := srv.Generate(context.Background(), r)
	if err != nil {
		tb.Error(err)
		return api.Result{}, false
	}
	res, err := st.Collect()
	if err != nil {
		tb.Error(err)
		return res, false
	}
	return res, true
}

// runStreams sends n concurrent requests of maxTokens each and returns the
// tokens received.
func runStreams(tb testing.TB, srv *mlxserving.Server, n, maxTokens int) int {
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prompt := []int32{int32(i%1000 + 1), 2, 3, 4, 5, 6, 7, 8}
			res, ok := generate(tb, srv, api.Request{Model: "sim", PromptTokens: prompt,
				Params: api.Params{MaxTokens: maxTokens, IgnoreEOS: true}})
			if !ok {
				return
			}
			mu.Lock()
			total += len(res.Tokens)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return total
}

// BenchmarkServingOverhead: 256 concurrent streams of 256 tokens on a
// simulated engine with 20 ms steps and max batch 64. The ideal is 64
// tokens per step; the report gives the fraction of it reached and the
// serving layer's CPU per generated token.
func BenchmarkServingOverhead(b *testing.B) { servingOverheadBoth(b, 64) }

// BenchmarkServingOverheadBatch256: the same with max batch 256, every
// stream in each step, as the torch engine runs 256 clients: the
// batcher's own time between steps (delivering 256 tokens, building 256
// inputs) is what an engine that overlaps the device with its host must
// hide behind one step.
func BenchmarkServingOverheadBatch256(b *testing.B) { servingOverheadBoth(b, 256) }

// servingOverheadBoth runs the serving-overhead benchmark with each
// token's text work behind the next step (the default,
// batcher.WithTextBehindStep) and before it, alternating.
func servingOverheadBoth(b *testing.B, maxBatch int) {
	for _, behind := range []bool{true, false} {
		name := "text=serial"
		if behind {
			name = "text=behind"
		}
		b.Run(name, func(b *testing.B) { servingOverhead(b, maxBatch, behind) })
	}
}

func servingOverhead(b *testing.B, maxBatch int, textBehind bool) {
	const step, streams, tokens = 20 * time.Millisecond, 256, 256
	tm := newTestMeter(b)
	srv, sim := simServerAndEngine(b, step, maxBatch, mlxserving.WithMeterProvider(tm),
		mlxserving.WithBatcherOptions(batcher.WithTextBehindStep(textBehind)))
	for b.Loop() {
		st0 := sim.Stats()
		cpu0, t0 := cpuTime(), time.Now()
		got := runStreams(b, srv, streams, tokens)
		wall, cpu := time.Since(t0), cpuTime()-cpu0
		st := sim.Stats()
		steps := st.Steps - st0.Steps
		cpu -= st.Polled - st0.Polled // the simulated device's, not the serving layer's
		ideal := float64(maxBatch) / step.Seconds()
		b.ReportMetric(float64(got)/wall.Seconds(), "tokens/s")
		b.ReportMetric(100*float64(got)/wall.Seconds()/ideal, "%ideal")
		b.ReportMetric(float64(cpu.Microseconds())/float64(got), "cpu-µs/token")
		b.ReportMetric(float64(got)/float64(steps), "tokens/step")
		// Wall time per step beyond the simulated step: the loop's own work
		// plus the OS timer's overshoot, measured alone below.
		b.ReportMetric(float64((wall-time.Duration(steps)*step).Microseconds())/float64(steps), "gap-µs/step")
	}
	// The batcher's own time between steps, as the server's metrics record
	// it (mlxserving.step.between).
	if sum, n := histogram(b, tm, "mlxserving.step.between"); n > 0 {
		b.ReportMetric(sum*1e6/float64(n), "between-µs/step")
	}
	b.ReportMetric(float64(timerOvershoot(step, 50).Microseconds()), "timer-overshoot-µs")
}

// timerOvershoot is how late a timer of d fires on this machine, on
// average: what each simulated step would add to the gap were it waited
// on a timer alone (the simulated engine polls the clock for the end of
// its wait so that it does not).
func timerOvershoot(d time.Duration, n int) time.Duration {
	var late time.Duration
	for range n {
		t0 := time.Now()
		<-time.After(d)
		late += time.Since(t0) - d
	}
	return late / time.Duration(n)
}

// BenchmarkStepLoop runs the same load on a simulated engine whose steps
// take no time, so the wall time per step is the serving layer's own cost:
// the batcher's loop plus the engine's bookkeeping, with 64 streams being
// read concurrently.
func BenchmarkStepLoop(b *testing.B) {
	const maxBatch, streams, tokens = 64, 256, 256
	srv, sim := simServerAndEngine(b, 0, maxBatch)
	for b.Loop() {
		steps0 := sim.Stats().Steps
		t0 := time.Now()
		got := runStreams(b, srv, streams, tokens)
		wall := time.Since(t0)
		steps := sim.Stats().Steps - steps0
		b.ReportMetric(float64(wall.Microseconds())/float64(steps), "µs/step")
		b.ReportMetric(float64(wall.Nanoseconds())/1000/float64(got), "µs/token")
	}
}

// BenchmarkContinuousVsSequential compares continuous batching with serving
// one request at a time (max batch 1) on the same simulated engine.
func BenchmarkContinuousVsSequential(b *testing.B) {
	const step, streams, tokens = 5 * time.Millisecond, 32, 32
	for _, mb := range []int{1, 32} {
		b.Run(fmt.Sprintf("maxBatch=%d", mb), func(b *testing.B) {
			srv := simServer(b, step, mb)
			for b.Loop() {
				t0 := time.Now()
				got := runStreams(b, srv, streams, tokens)
				b.ReportMetric(float64(got)/time.Since(t0).Seconds(), "tokens/s")
			}
		})
	}
}

// BenchmarkPriorityUnderSaturation offers more work than the simulated
// engine can run, across all tiers, and reports queue wait per tier. The
// critical tier's p99 must stay within its SLA while background work still
// completes.
func BenchmarkPriorityUnderSaturation(b *testing.B) {
	const step, maxBatch = 10 * time.Millisecond, 8
	srv := simServer(b, step, maxBatch, mlxserving.WithSchedulerOptions(scheduler.WithMaxQueued(100000)))
	for b.Loop() {
		waits := saturate(b, srv, 2*time.Second)
		for _, tier := range api.Tiers() {
			w := waits[tier]
			if len(w) == 0 {
				b.Fatalf("tier %s completed nothing", tier)
			}
			slices.Sort(w)
			b.ReportMetric(float64(w[len(w)/2].Microseconds())/1000, tier.String()+"-p50-ms")
			b.ReportMetric(float64(w[len(w)*99/100].Microseconds())/1000, tier.String()+"-p99-ms")
			b.ReportMetric(float64(len(w)), tier.String()+"-done")
		}
	}
}

// saturate submits requests of every tier at about twice what the engine can
// run for d, then waits for all of them, and returns queue waits by tier.
func saturate(tb testing.TB, srv *mlxserving.Server, d time.Duration) map[api.Tier][]time.Duration {
	var wg sync.WaitGroup
	var mu sync.Mutex
	waits := map[api.Tier][]time.Duration{}
	tiers := api.Tiers()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(6 * time.Millisecond)
	defer tick.Stop()
	for i := 0; time.Now().Before(deadline); i++ {
		<-tick.C
		tier := tiers[i%len(tiers)]
		maxTokens := 4 + i%13
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, ok := generate(tb, srv, api.Request{Model: "sim", PromptTokens: []int32{1, 2, 3, int32(i % 500)},
				Params: api.Params{MaxTokens: maxTokens, IgnoreEOS: true, Priority: tier}})
			if !ok {
				return
			}
			mu.Lock()
			waits[tier] = append(waits[tier], res.Usage.QueueWait)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return waits
}

// BenchmarkQueueFullRejection measures how fast Generate refuses a request
// when the queue already holds 10,000.
func BenchmarkQueueFullRejection(b *testing.B) {
	const queued = 10000
	srv := simServer(b, time.Hour, 1, mlxserving.WithSchedulerOptions(scheduler.WithMaxQueued(queued)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := api.Request{Model: "sim", PromptTokens: []int32{1, 2, 3}, Params: api.Params{MaxTokens: 4}}
	// One request occupies the engine (its step never ends); the rest queue
	// until the queue refuses. The streams are kept: a dropped Stream is
	// cancelled when the garbage collector finds it.
	var full *scheduler.QueueFullError
	var streams []*api.Stream
	for i := 0; ; i++ {
		st, err := srv.Generate(ctx, req)
		streams = append(streams, st)
		if errors.As(err, &full) {
			break
		}
		if err != nil || i > 2*queued {
			b.Fatalf("filling the queue: %v after %d requests", err, i)
		}
	}
	for b.Loop() {
		_, err := srv.Generate(ctx, req)
		if !errors.As(err, &full) {
			b.Fatalf("want QueueFullError, got %v", err)
		}
	}
	runtime.KeepAlive(streams)
}

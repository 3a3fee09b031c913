package batcher_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// BenchmarkPipelineClosedLoop serves 64 closed-loop clients — 1,000-token
// prompts, 128 tokens each — on the simulated engine (4 ms a step plus
// 0.5 µs a token, a device that runs the steps it is sent back to back),
// with steps sent ahead (WithPipeline, the default) and without. Reported:
// requests a second, time to first token (p50, p99) and the mean batch.
// What pipelining gives here is the batcher's own time between steps;
// what it costs is a step of time to first token under load: a request
// arriving while step N runs is planned into N+2.
func BenchmarkPipelineClosedLoop(b *testing.B) {
	for _, pipe := range []bool{true, false} {
		name := "pipeline=off"
		if pipe {
			name = "pipeline=on"
		}
		b.Run(name, func(b *testing.B) {
			var reqs, batch float64
			var ttft []time.Duration
			var el time.Duration
			for range b.N {
				r, t, mean, d := closedLoop(b, pipe)
				reqs, batch, el = reqs+r, batch+mean, el+d
				ttft = append(ttft, t...)
			}
			slices.Sort(ttft)
			b.ReportMetric(reqs/el.Seconds(), "req/s")
			b.ReportMetric(float64(ttft[len(ttft)/2])/1e6, "ttft-p50-ms")
			b.ReportMetric(float64(ttft[len(ttft)*99/100])/1e6, "ttft-p99-ms")
			b.ReportMetric(batch/float64(b.N), "mean-batch")
		})
	}
}

// closedLoop runs one load of BenchmarkPipelineClosedLoop: the requests
// served, their times to first token, the mean batch and the time taken.
func closedLoop(b *testing.B, pipe bool) (reqs float64, ttft []time.Duration, meanBatch float64, took time.Duration) {
	const clients, each = 64, 6
	r := newRig(b, []enginetest.SimOption{enginetest.WithStepTime(4*time.Millisecond, 500*time.Nanosecond), enginetest.WithMaxBatch(256),
		enginetest.WithKVCapacity(1 << 22), enginetest.WithContextLength(1 << 16)}, nil, batcher.WithPipeline(pipe), batcher.WithTokenBudget(2048))
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			for i := range each {
				s := &batcher.Sequence{Prompt: prompt(c*100+i, 1000), MaxTokens: 128, IgnoreEOS: true}
				r.submit(b, s)
				res := collect(s)
				if res.err != nil {
					b.Error(res.err)
					return
				}
				mu.Lock()
				ttft = append(ttft, res.usage.TimeToFirstToken)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	took = time.Since(start)
	st := r.b.Stats()
	return clients * each, ttft, float64(st.Inputs) / float64(st.Steps), took
}

package natsbackend_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/retry"
)

// BenchmarkClusterInstanceKill: 48 streaming clients (64-token requests,
// half greedy, half seeded with penalties, back to back) through a
// balancer.LoadBalancer over NATS to 3 instances on the simulated engine (5 ms
// steps); 1 s into a 3 s run one instance's connection drops, as a killed
// process's does. Its streams resume on the other instances: it reports
// the requests completed, resumed, interrupted (*retry.InterruptedError)
// and otherwise failed — the last two must be none — and the resume gap's
// p50 and p99 (Usage.ResumeGap).
//
//	go test ./balancer/natsbackend -run '^$' -bench ClusterInstanceKill -benchtime 1x
func BenchmarkClusterInstanceKill(b *testing.B) {
	for b.Loop() {
		n := startNATS(b)
		names := []string{"i0", "i1", "i2"}
		var victim *instance
		for _, name := range names {
			in := startInstance(b, n, name, enginetest.WithStepTime(5*time.Millisecond, 0))
			if victim == nil {
				victim = in
			}
		}
		lb, d := newBalancer(b, n)
		waitInstances(b, d, names...)
		var completed, resumed, interrupted, failed atomic.Int64
		var mu sync.Mutex
		var gaps []time.Duration
		stop := time.Now().Add(3 * time.Second)
		time.AfterFunc(time.Second, victim.nc.Close)
		var wg sync.WaitGroup
		for c := range 48 {
			wg.Go(func() {
				for i := 0; time.Now().Before(stop); i++ {
					p := api.Params{MaxTokens: 64, IgnoreEOS: true}
					if c%2 == 1 {
						p.Sampling = engine.SamplingParams{Temperature: 0.9, Seed: uint64(c*1000 + i), HasSeed: true, PresencePenalty: 0.5}
					}
					st, err := lb.Generate(context.Background(), api.Request{Model: "tiny", PromptTokens: []int32{int32(c), int32(i % 50), 3, 4}, Params: p})
					var res api.Result
					if err == nil {
						res, err = st.Collect()
					}
					var ie *retry.InterruptedError
					switch {
					case err == nil:
						completed.Add(1)
						if res.Usage.Resumes > 0 {
							resumed.Add(1)
							mu.Lock()
							gaps = append(gaps, res.Usage.ResumeGap)
							mu.Unlock()
						}
					case errors.As(err, &ie):
						interrupted.Add(1)
					default:
						failed.Add(1)
						b.Log(err)
					}
				}
			})
		}
		wg.Wait()
		slices.Sort(gaps)
		b.ReportMetric(float64(completed.Load()), "completed")
		b.ReportMetric(float64(resumed.Load()), "resumed")
		b.ReportMetric(float64(interrupted.Load()), "interrupted")
		b.ReportMetric(float64(failed.Load()), "failed")
		if len(gaps) > 0 {
			b.ReportMetric(float64(gaps[len(gaps)/2].Microseconds())/1e3, "gap_p50_ms")
			b.ReportMetric(float64(gaps[min(len(gaps)-1, len(gaps)*99/100)].Microseconds())/1e3, "gap_p99_ms")
		}
		if interrupted.Load()+failed.Load() > 0 {
			b.Errorf("%d streams interrupted, %d failed", interrupted.Load(), failed.Load())
		}
	}
}

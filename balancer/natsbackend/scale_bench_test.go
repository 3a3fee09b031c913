package natsbackend_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// BenchmarkClusterScaling measures throughput through a balancer.LoadBalancer over
// NATS with 1 and with 3 instances, each on the simulated engine
// (enginetest.Sim) with a fixed 5 ms step and at most 4 sequences per
// batch, under 24 concurrent 32-token requests: the instances are the
// bottleneck, so 3 should give close to 3x.
func BenchmarkClusterScaling(b *testing.B) {
	for _, instances := range []int{1, 3} {
		b.Run(fmt.Sprintf("instances=%d", instances), func(b *testing.B) {
			n := startNATS(b)
			var names []string
			for i := range instances {
				name := fmt.Sprintf("i%d", i)
				startInstance(b, n, name, enginetest.WithStepTime(5*time.Millisecond, 0), enginetest.WithMaxBatch(4))
				names = append(names, name)
			}
			lb, d := newBalancer(b, n)
			waitInstances(b, d, names...)
			waitFor(b, "load reports", func() bool { return len(lb.Load().Models) == 1 })
			const concurrency, tokens = 24, 32
			req := api.Request{Model: "tiny", PromptTokens: []int32{1, 2, 3, 4}, Params: api.Params{MaxTokens: tokens, IgnoreEOS: true}}
			total := 0
			var mu sync.Mutex
			for b.Loop() {
				var wg sync.WaitGroup
				for range concurrency {
					wg.Go(func() {
						st, err := lb.Generate(context.Background(), req)
						if err != nil {
							b.Error(err)
							return
						}
						res, err := st.Collect()
						if err != nil {
							b.Error(err)
							return
						}
						mu.Lock()
						total += res.Usage.CompletionTokens
						mu.Unlock()
					})
				}
				wg.Wait()
			}
			b.ReportMetric(float64(total)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

package chaos

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkThroughput: tokens per second streamed through the gateway
// from 1 and from 3 instances (examples/server on the simulated engine,
// 10 ms steps, 8 sequences a batch: 800 tokens/s each at most), every one
// its own process behind one NATS server, under 48 streaming clients. The
// ratio of the two is how far the cluster scales; b.N is the number of
// requests (of 32 tokens), so run it with -benchtime Nx.
func BenchmarkThroughput(b *testing.B) {
	bin := buildBinaries(b)
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("instances=%d", n), func(b *testing.B) {
			c := newCluster(b, bin, 1, "-max-batch", "8")
			began := time.Now()
			for i := range n {
				c.startInstance(fmt.Sprintf("i%d", i+1), 0)
			}
			c.startGateway()
			for i := range n {
				c.waitFound(fmt.Sprintf("i%d", i+1), began.Add(-time.Minute))
			}
			const clients = 48
			l := newLoad(c.gwURL, clients, 32)
			defer l.client.CloseIdleConnections()
			var left, tokens, failed atomic.Int64
			left.Store(int64(b.N))
			var wg sync.WaitGroup
			b.ResetTimer()
			for range clients {
				wg.Go(func() {
					for left.Add(-1) >= 0 {
						r := l.request()
						tokens.Add(int64(r.tokens))
						if r.outcome != completed {
							failed.Add(1)
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			if failed.Load() > 0 {
				b.Errorf("%d requests did not complete; gateway log:\n%s", failed.Load(), c.gw.output())
			}
			b.ReportMetric(float64(tokens.Load())/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

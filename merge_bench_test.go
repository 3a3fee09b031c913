package mlxserving_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
)

// BenchmarkMerge64 sends 64 identical greedy requests at once on the
// simulated engine (1 ms steps) with request merging on and off. It
// reports the tokens the engine sampled per round: with merging, one
// generation's worth (generations/op = 1).
func BenchmarkMerge64(b *testing.B) {
	const n, maxTokens = 64, 32
	for _, on := range []bool{true, false} {
		name := "merging=off"
		var opts []mlxserving.Option
		if on {
			name, opts = "merging=on", []mlxserving.Option{mlxserving.WithMerging()}
		}
		b.Run(name, func(b *testing.B) {
			srv, sim := simServerAndEngine(b, time.Millisecond, 64, opts...)
			round := int32(0)
			for b.Loop() {
				round++
				r := api.Request{Model: "sim", PromptTokens: []int32{round, 2, 3, 4, 5, 6, 7, 8},
					Params: api.Params{MaxTokens: maxTokens, IgnoreEOS: true}}
				var wg sync.WaitGroup
				var bad atomic.Int32
				start := make(chan struct{})
				for range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						if res, ok := generate(b, srv, r); !ok || len(res.Tokens) != maxTokens {
							bad.Add(1)
						}
					}()
				}
				close(start)
				wg.Wait()
				if bad.Load() > 0 {
					b.Fatalf("%d of %d requests did not get %d tokens", bad.Load(), n, maxTokens)
				}
			}
			sampled := float64(sim.Stats().Sampled) / float64(b.N)
			b.ReportMetric(sampled, "sampled/op")
			b.ReportMetric(sampled/maxTokens, "generations/op")
			b.ReportMetric(float64(sim.Stats().Steps)/float64(b.N), "steps/op")
		})
	}
}

// BenchmarkMergeOverhead runs one request at a time, each with a new
// prompt (every one a miss that starts its own generation), on the
// simulated engine with zero step time, with merging on and off: the
// difference in ns/op is what the merge path (key hashing, the flight,
// the subscriber between the stream and the batcher) costs a request.
func BenchmarkMergeOverhead(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "merging=off"
		var opts []mlxserving.Option
		if on {
			name, opts = "merging=on", []mlxserving.Option{mlxserving.WithMerging()}
		}
		b.Run(name, func(b *testing.B) {
			srv := simServer(b, 0, 64, opts...)
			ctx := context.Background()
			i := int32(0)
			cpu0 := cpuTime()
			for b.Loop() {
				i++
				st, err := srv.Generate(ctx, api.Request{Model: "sim", PromptTokens: []int32{i % 30000, i / 30000, 3, 4},
					Params: api.Params{MaxTokens: 8, IgnoreEOS: true}})
				if err != nil {
					b.Fatal(err)
				}
				if res, err := st.Collect(); err != nil || len(res.Tokens) != 8 {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			if on && srv.MergeStats().Misses != uint64(b.N) {
				b.Fatalf("merge stats %+v after %d requests", srv.MergeStats(), b.N)
			}
		})
	}
}

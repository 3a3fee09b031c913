package natsbackend_test

import (
	"context"
	"testing"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
)

// BenchmarkHop compares a request served by the Server directly with the
// same request over the NATS hop (Client -> embedded nats-server on
// loopback -> Service -> Server), on the simulated engine
// (enginetest.Sim) with zero step time, so the figures are the serving
// layer's cost. "1tok" is the per-request overhead; "256tok" reports
// tokens/s.
func BenchmarkHop(b *testing.B) {
	n := startNATS(b)
	in := startInstance(b, n, "a")
	_, d := newBalancer(b, n)
	waitInstances(b, d, "a")
	c := d.Client("a")
	for _, via := range []struct {
		name string
		g    balancer.Backend
	}{{"direct", in.srv}, {"nats", c}} {
		for _, tokens := range []int{1, 256} {
			name := via.name + "/1tok"
			if tokens > 1 {
				name = via.name + "/256tok"
			}
			b.Run(name, func(b *testing.B) {
				req := api.Request{Model: "tiny", PromptTokens: []int32{1, 2, 3, 4}, Params: api.Params{MaxTokens: tokens, IgnoreEOS: true}}
				b.ReportAllocs()
				total := 0
				for b.Loop() {
					st, err := via.g.Generate(context.Background(), req)
					if err != nil {
						b.Fatal(err)
					}
					res, err := st.Collect()
					if err != nil {
						b.Fatal(err)
					}
					total += res.Usage.CompletionTokens
				}
				b.ReportMetric(float64(total)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}

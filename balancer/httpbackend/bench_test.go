package httpbackend_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// BenchmarkHop compares a request served by the Server directly with the
// same request over the HTTP hop (httpbackend -> loopback -> openai
// handler -> Server), on the simulated engine (enginetest.Sim) with zero
// step time, so the figures are the serving layer's cost. "1tok" is the
// per-request overhead; "256tok" reports tokens/s.
func BenchmarkHop(b *testing.B) {
	u := newUpstream(b, nil)
	hb := newBackend(b, u.ts.URL)
	for _, via := range []struct {
		name string
		g    balancer.Backend
	}{{"direct", u.srv}, {"http", hb}} {
		for _, n := range []int{1, 256} {
			name := via.name + "/1tok"
			if n > 1 {
				name = via.name + "/256tok"
			}
			b.Run(name, func(b *testing.B) {
				req := api.Request{Model: "tiny", PromptTokens: []int32{1, 2, 3, 4}, Params: api.Params{MaxTokens: n, IgnoreEOS: true}}
				b.ReportAllocs()
				tokens := 0
				for b.Loop() {
					st, err := via.g.Generate(context.Background(), req)
					if err != nil {
						b.Fatal(err)
					}
					res, err := st.Collect()
					if err != nil {
						b.Fatal(err)
					}
					tokens += res.Usage.CompletionTokens
				}
				b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}

// BenchmarkEmbedHop compares an embedding request served by the Server
// directly with the same request over the HTTP hop, on the simulated
// engine with zero step time and 1024-value vectors: "1in" is the
// per-request overhead, "256in" (1 MiB of vectors, base64) reports
// vectors/s.
func BenchmarkEmbedHop(b *testing.B) {
	u := newUpstream(b, []enginetest.SimOption{enginetest.WithEmbedding(1024, engine.PoolMean, true, false)})
	hb := newBackend(b, u.ts.URL)
	for _, via := range []struct {
		name string
		g    balancer.Backend
	}{{"direct", u.srv}, {"http", hb}} {
		for _, inputs := range []int{1, 256} {
			b.Run(fmt.Sprintf("%s/%din", via.name, inputs), func(b *testing.B) {
				req := api.EmbedRequest{Model: "tiny", Inputs: make([]api.EmbedInput, inputs)}
				for i := range req.Inputs {
					req.Inputs[i].Tokens = []int32{int32(1 + i%200), int32(2 + i/200), 3, 4}
				}
				b.ReportAllocs()
				vectors := 0
				for b.Loop() {
					res, err := via.g.Embed(context.Background(), req)
					if err != nil {
						b.Fatal(err)
					}
					vectors += len(res.Vectors)
				}
				b.ReportMetric(float64(vectors)/b.Elapsed().Seconds(), "vectors/s")
			})
		}
	}
}

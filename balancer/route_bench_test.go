package balancer_test

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
)

// routeOnly is a backend whose load report is a real Server's (4 models,
// each with its batcher and queue: the walk a local backend's Load does)
// and whose streams end at once, so a benchmark through it measures what
// the balancer spends choosing a backend, not what the backend spends
// generating.
type routeOnly struct{ srv *mlxserving.Server }

func (r routeOnly) Load() balancer.Load { return r.srv.Load() }

func (r routeOnly) Generate(ctx context.Context, _ api.Request) (*api.Stream, error) {
	return api.NewStream(ctx, endSource{}, api.Header{}), nil
}

func (r routeOnly) Chat(ctx context.Context, _ api.ChatRequest) (*api.Stream, error) {
	return api.NewStream(ctx, endSource{}, api.Header{}), nil
}

func (r routeOnly) Embed(_ context.Context, req api.EmbedRequest) (*api.Embeddings, error) {
	return &api.Embeddings{Model: req.Model, Vectors: make([][]float32, len(req.Inputs))}, nil
}

// endSource is a stream with nothing in it.
type endSource struct{}

func (endSource) Recv(context.Context) (api.Chunk, error) { return api.Chunk{}, io.EOF }
func (endSource) Close(error)                             {}

// BenchmarkRoute is the per-request routing cost: parallel callers
// (GOMAXPROCS of them) send 1-token requests through a balancer of n
// backends whose load reports are real Servers' and whose streams are
// empty, with the default weighted strategy; "sessions" adds a session
// per caller and an affinity store 200 µs away.
//
//	go test -run '^$' -bench Route -benchtime 2s -count 3 ./balancer
func BenchmarkRoute(b *testing.B) {
	for _, n := range []int{4, 16, 64} {
		servers := make([]*mlxserving.Server, n)
		for i := range servers {
			servers[i] = newInstance(b, 0, "a", "b", "c", "m").srv
		}
		for _, sessions := range []bool{false, true} {
			b.Run(fmt.Sprintf("backends=%d/sessions=%v", n, sessions), func(b *testing.B) {
				opts := []balancer.Option{}
				if sessions {
					opts = append(opts, balancer.WithAffinityStore(&memStore{rtt: 200 * time.Microsecond, homes: map[string]string{}}, 0))
				}
				lb := newBalancer(b, opts...)
				for i, srv := range servers {
					if err := lb.Add(fmt.Sprintf("b%02d", i), routeOnly{srv}); err != nil {
						b.Fatal(err)
					}
				}
				var caller sync.Mutex
				callers := 0
				b.RunParallel(func(pb *testing.PB) {
					req := request("m", 1)
					req.Prompt = "You are a helpful assistant. Answer briefly and precisely, please. What is the capital of France?"
					if sessions {
						caller.Lock()
						req.Session = fmt.Sprint("s", callers)
						callers++
						caller.Unlock()
					}
					for pb.Next() {
						st, err := lb.Generate(context.Background(), req)
						if err != nil {
							b.Error(err)
							return
						}
						st.Close()
					}
				})
			})
		}
	}
}

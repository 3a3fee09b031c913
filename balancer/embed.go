package balancer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/mlxserving/mlxserving/api"
)

// Embed routes an embedding request to a backend that serves the model,
// failing over to another while backends refuse it or fail, as a stream
// that has delivered nothing does; see [LoadBalancer].
func (lb *LoadBalancer) Embed(ctx context.Context, req api.EmbedRequest) (*api.Embeddings, error) {
	var mu sync.Mutex
	var res *api.Embeddings
	st, err := lb.serve(ctx, Route{Model: req.Model}, func(ctx context.Context, b Backend, _ []int32) (*api.Stream, error) {
		r, err := b.Embed(ctx, req)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		res = r
		mu.Unlock()
		return api.NewStream(ctx, answered{}, api.Header{Model: r.Model}), nil
	})
	if err != nil {
		return nil, err
	}
	// The stream's end reports the attempt to the backend's breaker.
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		st.Close()
		return nil, fmt.Errorf("balancer: embedding stream: %w", err)
	}
	mu.Lock()
	defer mu.Unlock()
	return res, nil
}

// answered is the empty stream of a unary call that has answered.
type answered struct{}

func (answered) Recv(context.Context) (api.Chunk, error) { return api.Chunk{}, io.EOF }
func (answered) Close(error)                             {}

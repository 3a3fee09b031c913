package mlxserving_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/merge"
	"github.com/mlxserving/mlxserving/retry"
)

// Two identical greedy requests in flight together share one generation;
// the same request later, opted in to the cache, is replayed from it.
func ExampleWithMerging() {
	ctx := context.Background()
	eng, _ := enginetest.NewSim(enginetest.WithStepTime(time.Millisecond, 0))
	defer eng.Close()
	srv, _ := mlxserving.New(eng, mlxserving.WithMerging(merge.WithCache(64<<20, 10*time.Minute)))
	defer srv.Close()
	_ = srv.LoadModel(ctx, engine.ModelSpec{ID: "sim"})

	r := api.Request{Model: "sim", PromptTokens: []int32{1, 2, 3},
		Params: api.Params{MaxTokens: 16, IgnoreEOS: true, Cache: true}}
	a, _ := srv.Generate(ctx, r)
	b, _ := srv.Generate(ctx, r)
	ra, _ := a.Collect()
	rb, _ := b.Collect()
	c, _ := srv.Generate(ctx, r)
	rc, _ := c.Collect()
	fmt.Println(a.Header().Cache, b.Header().Cache, c.Header().Cache)
	fmt.Println(len(ra.Tokens), len(rb.Tokens), len(rc.Tokens), eng.Stats().Sampled)
	// Output:
	// miss merged hit
	// 16 16 16 16
}

// A request whose first token does not come in time ends with an error
// that names the deadline.
func ExampleWithDeadlines() {
	ctx := context.Background()
	eng, _ := enginetest.NewSim(enginetest.WithStepTime(50*time.Millisecond, 0))
	defer eng.Close()
	srv, _ := mlxserving.New(eng, mlxserving.WithDeadlines(retry.Deadlines{FirstToken: 10 * time.Millisecond}))
	defer srv.Close()
	_ = srv.LoadModel(ctx, engine.ModelSpec{ID: "sim"})

	st, _ := srv.Generate(ctx, api.Request{Model: "sim", PromptTokens: []int32{1, 2, 3}, Params: api.Params{MaxTokens: 4}})
	_, err := st.Collect()
	var de *retry.DeadlineError
	fmt.Println(errors.As(err, &de), de.Kind)
	// Output: true time_to_first_token
}

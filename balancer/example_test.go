package balancer_test

import (
	"context"
	"fmt"
	"log"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// A balancer over two local Servers, taking turns.
func Example() {
	ctx := context.Background()
	lb, err := balancer.New(balancer.WithStrategy(balancer.RoundRobin()))
	if err != nil {
		log.Fatal(err)
	}
	defer lb.Close()
	for _, name := range []string{"a", "b"} {
		eng, err := enginetest.NewSim()
		if err != nil {
			log.Fatal(err)
		}
		defer eng.Close()
		srv, err := mlxserving.New(eng)
		if err != nil {
			log.Fatal(err)
		}
		defer srv.Close()
		if err := srv.LoadModel(ctx, engine.ModelSpec{ID: "m"}); err != nil {
			log.Fatal(err)
		}
		if err := lb.Add(name, srv); err != nil {
			log.Fatal(err)
		}
	}
	for range 4 {
		st, err := lb.Generate(ctx, api.Request{Model: "m", PromptTokens: []int32{1, 2, 3}, Params: api.Params{MaxTokens: 2, IgnoreEOS: true}})
		if err != nil {
			log.Fatal(err)
		}
		res, err := st.Collect()
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(st.Header().Backend, len(res.Tokens))
	}
	// Output:
	// a 2
	// b 2
	// a 2
	// b 2
}

package mlxserving_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// A Server over the simulated engine: generate from token ids and read the
// stream as an iterator.
func ExampleServer_Generate() {
	ctx := context.Background()
	eng, _ := enginetest.NewSim()
	defer eng.Close()
	srv, _ := mlxserving.New(eng)
	defer srv.Close()
	if err := srv.LoadModel(ctx, engine.ModelSpec{ID: "sim"}); err != nil {
		fmt.Println(err)
		return
	}

	st, err := srv.Generate(ctx, api.Request{
		Model:        "sim",
		PromptTokens: []int32{1, 2, 3},
		Params:       api.Params{MaxTokens: 5, IgnoreEOS: true, Priority: api.High},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	tokens := 0
	for c, err := range st.Chunks() {
		if err != nil {
			fmt.Println(err)
			return
		}
		if c.HasToken {
			tokens++
		}
		if c.Finish != "" {
			fmt.Println("tokens:", tokens, "finish:", c.Finish, "prompt tokens:", c.Usage.PromptTokens)
		}
	}
	// Output: tokens: 5 finish: length prompt tokens: 3
}

// Bad input is refused before it is queued, with a typed error.
func ExampleServer_Generate_badInput() {
	ctx := context.Background()
	eng, _ := enginetest.NewSim(enginetest.WithContextLength(128))
	defer eng.Close()
	srv, _ := mlxserving.New(eng)
	defer srv.Close()
	_ = srv.LoadModel(ctx, engine.ModelSpec{ID: "sim"})

	_, err := srv.Generate(ctx, api.Request{Model: "sim", PromptTokens: make([]int32, 100),
		Params: api.Params{MaxTokens: 50}})
	var tooLong *engine.ContextLengthError
	fmt.Println(errors.As(err, &tooLong), tooLong.Prompt, tooLong.MaxNew, tooLong.Limit)
	// Output: true 100 50 128
}

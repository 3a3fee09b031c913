package httpbackend_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer/httpbackend"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/openai"
	"github.com/mlxserving/mlxserving/testmodel"
)

// A Backend over a remote OpenAI-compatible server: here another
// mlxserving instance (on the simulated engine, enginetest.Sim) on a
// loopback port.
func Example() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	_ = testmodel.Write(dir, testmodel.Tiny())
	sim, _ := enginetest.NewSim(enginetest.WithVocabSize(testmodel.Tiny().Vocab))
	defer sim.Close()
	srv, _ := mlxserving.New(sim)
	defer srv.Close()
	_ = srv.LoadModel(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir})
	h, _ := openai.New(srv)
	upstream := httptest.NewServer(h)
	defer upstream.Close()

	b, err := httpbackend.New(upstream.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	_ = b.Refresh(context.Background())
	fmt.Println("models", b.Load().Models)

	st, err := b.Chat(context.Background(), api.ChatRequest{
		Model:    "tiny",
		Messages: []api.Message{{Role: "user", Content: "Hello"}},
		Params:   api.Params{MaxTokens: 5, IgnoreEOS: true},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	res, _ := st.Collect()
	fmt.Println("tokens", res.Usage.CompletionTokens, "finish", res.Finish)
	// Output:
	// models [tiny]
	// tokens 5 finish length
}

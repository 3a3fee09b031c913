package pyproc_test

import (
	"context"
	"fmt"
	"log"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/pyproc"
)

// Greedy decoding of a few tokens with a CPU worker. (Compiled, not run:
// it needs Python with PyTorch and a checkpoint directory.)
func Example() {
	ctx := context.Background()
	eng, err := pyproc.New(ctx, pyproc.WithPython("/usr/bin/python3"), pyproc.WithDevice("cpu"))
	if err != nil {
		log.Fatal(err) // wraps engine.ErrUnavailable when torch is missing
	}
	defer eng.Close()
	m, err := eng.Load(ctx, engine.ModelSpec{ID: "tiny", Path: "/path/to/checkpoint"})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	prompt := []int32{1, 2, 3}
	if _, err := m.Open(ctx, 1, prompt, ""); err != nil {
		log.Fatal(err)
	}
	defer m.Free(1, "")
	feed := prompt
	for range 4 {
		out, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: feed, Sample: true, Params: &engine.SamplingParams{}}})
		if err != nil {
			log.Fatal(err) // retry.Retryable(err) after a lost worker
		}
		fmt.Println(out[0].Token)
		feed = []int32{out[0].Token}
	}
}

package prewarm_test

import (
	"context"
	"fmt"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/prewarm"
)

// Pre-warm two models by priority on the simulated engine and report
// ready once the important one is warm.
func Example() {
	ctx := context.Background()
	sim, _ := enginetest.NewSim(enginetest.WithMaxBatch(8), enginetest.WithVocabSize(1000))
	defer sim.Close()
	srv, _ := mlxserving.New(sim)
	defer srv.Close()

	pw, err := prewarm.New(srv, []prewarm.Model{
		{Spec: engine.ModelSpec{ID: "code"}, Priority: 1},
		{Spec: engine.ModelSpec{ID: "chat"}, Priority: 10, Pin: true},
	}, prewarm.WithReadiness(prewarm.WhileWarming(10)))
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := pw.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer pw.Stop()
	if err := pw.Ready(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("ready: chat serves")
	_ = pw.Wait(ctx)
	for _, m := range pw.Status().Models {
		fmt.Printf("%s: %s, warmed batch sizes %v\n", m.ID, m.Phase, m.Warm.BatchSizes)
	}
	// Output:
	// ready: chat serves
	// chat: ready, warmed batch sizes [1 2 4 8]
	// code: ready, warmed batch sizes [1 2 4 8]
}

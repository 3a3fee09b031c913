package natsbackend_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/testmodel"
)

// An instance serves its Server over NATS; a balancer discovers it and
// routes a request to it. (The instance runs the simulated engine,
// enginetest.Sim, and the NATS server is embedded.)
func Example() {
	ns, _ := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	go ns.Start()
	ns.ReadyForConnections(5 * time.Second)
	defer ns.Shutdown()

	// The instance.
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	_ = testmodel.Write(dir, testmodel.Tiny())
	sim, _ := enginetest.NewSim(enginetest.WithVocabSize(testmodel.Tiny().Vocab))
	defer sim.Close()
	srv, _ := mlxserving.New(sim)
	defer srv.Close()
	_ = srv.LoadModel(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir})
	inc, _ := nats.Connect(ns.ClientURL())
	defer inc.Close()
	svc, err := natsbackend.Serve(inc, "gpu-1", srv)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer svc.Stop()

	// The balancer.
	lb, _ := balancer.New()
	defer lb.Close()
	bnc, _ := nats.Connect(ns.ClientURL())
	defer bnc.Close()
	d, _ := natsbackend.Discover(context.Background(), bnc, lb)
	defer d.Close()
	for len(lb.Load().Models) == 0 {
		time.Sleep(10 * time.Millisecond)
	}

	st, err := lb.Generate(context.Background(), api.Request{Model: "tiny", Prompt: "Hello", Params: api.Params{MaxTokens: 4, IgnoreEOS: true}})
	if err != nil {
		fmt.Println(err)
		return
	}
	res, _ := st.Collect()
	fmt.Println("served by", st.Header().Backend, "tokens", res.Usage.CompletionTokens, "finish", res.Finish)
	// Output: served by gpu-1 tokens 4 finish length
}

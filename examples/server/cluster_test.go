package main

import (
	"context"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/internal/natstest"
)

// TestJoinsCluster: with -nats the server serves as an instance that a
// balancer discovers and reaches (with the instance user of the tested
// nats-server configuration); on shutdown it leaves the cluster.
func TestJoinsCluster(t *testing.T) {
	url := natstest.Start(t, "../../balancer/natsbackend/testdata/nats-server.conf")
	t.Setenv(natsPasswordEnv, "instance-secret")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listening := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-engine", "sim", "-nats", url, "-instance", "node-1",
			"-nats-user", "instance", "-nats-drain-notice", "100ms"}, io.Discard, listening)
	}()
	select {
	case <-listening:
	case err := <-done:
		t.Fatalf("server exited: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("server did not start")
	}
	gw, err := nats.Connect(url, nats.UserInfo("gateway", "gateway-secret"))
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	lb, err := balancer.New()
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	d, err := natsbackend.Discover(ctx, gw, lb, natsbackend.WithInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	waitUntil(t, "node-1 discovered", func() bool { return slices.Equal(d.Instances(), []string{"node-1"}) })
	st, err := lb.Generate(context.Background(), api.Request{Model: "tiny", PromptTokens: []int32{1, 2, 3}, Params: api.Params{MaxTokens: 4}})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := st.Collect(); err != nil || res.Usage.CompletionTokens != 4 {
		t.Fatalf("through the cluster: %+v, %v", res, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "node-1 gone", func() bool { return len(d.Instances()) == 0 })
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

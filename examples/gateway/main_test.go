package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/balancer/natsbackend/natstest"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/testmodel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestGatewayOverNATS: the gateway (user gateway of the tested nats-server
// configuration) finds an instance (user instance) and answers the OpenAI
// API through it.
func TestGatewayOverNATS(t *testing.T) {
	url := natstest.Start(t, "../../balancer/natsbackend/testdata/nats-server.conf")

	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	sim, err := enginetest.NewSim(enginetest.WithVocabSize(testmodel.Tiny().Vocab))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	srv, err := mlxserving.New(sim)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir}); err != nil {
		t.Fatal(err)
	}
	inc, err := nats.Connect(url, nats.UserInfo("instance", "instance-secret"))
	if err != nil {
		t.Fatal(err)
	}
	defer inc.Close()
	svc, err := natsbackend.Serve(inc, "node-1", srv)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = svc.Stop() }()

	t.Setenv(natsPasswordEnv, "gateway-secret")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listening := make(chan string, 1)
	done := make(chan error, 1)
	keys := filepath.Join(t.TempDir(), "keys.json")
	if err := os.WriteFile(keys, []byte(`{"keys": [{"name": "ops", "key": "ops-secret", "admin": true}, {"name": "app", "key": "app-secret"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-nats", url, "-nats-user", "gateway", "-strategy", "least-loaded", "-api-keys", keys},
			io.Discard, listening)
	}()
	var addr string
	select {
	case addr = <-listening:
	case err := <-done:
		t.Fatalf("gateway exited: %v", err)
	}
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	body := `{"model":"tiny","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	var got string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		code, b := call(t, client, http.MethodPost, "http://"+addr+"/v1/chat/completions", "app-secret", body)
		got = b
		if code == 200 { // once discovery found the instance
			break
		}
	}
	if !strings.Contains(got, `"completion_tokens":4`) {
		t.Fatalf("through the gateway: %s", got)
	}
	checkMetrics(t, client, "http://"+addr)
	checkStats(t, client, "http://"+addr)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{}, {"-strategy", "nope", "-upstream", "http://127.0.0.1:1"}, {"extra"},
		{"-nats", "nats://127.0.0.1:4222", "-probe-interval", "0s"}, {"-nats", "nats://127.0.0.1:4222", "-nats-heartbeat", "-1s"},
		{"-nats", "nats://127.0.0.1:4222", "-discovery-interval", "2s", "-discovery-timeout", "1s"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

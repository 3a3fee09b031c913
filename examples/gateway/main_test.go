package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/internal/natstest"
	"github.com/mlxserving/mlxserving/testmodel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestGatewayOverNATS: the gateway (user gateway of the tested nats-server
// configuration) finds an instance (user instance) and answers the OpenAI
// API through it.
func TestGatewayOverNATS(t *testing.T) {
	url := withInstance(t)
	keys := filepath.Join(t.TempDir(), "keys.json")
	if err := os.WriteFile(keys, []byte(`{"keys": [{"name": "ops", "key": "ops-secret", "admin": true}, {"name": "app", "key": "app-secret"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, stop := startGateway(t, "-nats", url, "-nats-user", "gateway", "-strategy", "least-loaded", "-api-keys", keys)
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
	stop()
}

// startGateway runs the gateway with args on a port of its choosing and
// returns its address and the function that stops it (and fails the test
// if it exited with an error).
func startGateway(t *testing.T, args ...string) (addr string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	listening := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, append([]string{"-addr", "127.0.0.1:0"}, args...), io.Discard, listening) }()
	select {
	case addr = <-listening:
	case err := <-done:
		cancel()
		t.Fatalf("gateway exited: %v", err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(stop)
	return addr, stop
}

// withInstance starts a nats-server with the tested configuration and
// instance node-1 on it, sets the gateway user's password for the
// gateway, and returns the server's URL.
func withInstance(t *testing.T) string {
	t.Helper()
	url := natstest.Start(t, "../../balancer/natsbackend/testdata/nats-server.conf")
	inc, err := nats.Connect(url, nats.UserInfo("instance", "instance-secret"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inc.Close)
	serveInstance(t, inc, "node-1")
	t.Setenv(natsPasswordEnv, "gateway-secret")
	return url
}

// serveInstance serves a Server on the simulated engine with the tiny
// test model as instance name on nc, until the test ends, and returns
// the Server.
func serveInstance(t *testing.T, nc *nats.Conn, name string) *mlxserving.Server {
	t.Helper()
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	sim, err := enginetest.NewSim(enginetest.WithVocabSize(testmodel.Tiny().Vocab))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	srv, err := mlxserving.New(sim)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir}); err != nil {
		t.Fatal(err)
	}
	svc, err := natsbackend.Serve(nc, name, srv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	return srv
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{}, {"-strategy", "nope", "-upstream", "http://127.0.0.1:1"}, {"extra"},
		{"-nats", "nats://127.0.0.1:4222", "-probe-interval", "0s"}, {"-nats", "nats://127.0.0.1:4222", "-nats-heartbeat", "-1s"},
		{"-nats", "nats://127.0.0.1:4222", "-nats-reconnect-grace", "-1s"},
		{"-nats", "nats://127.0.0.1:4222", "-probe-timeout", "0s"},
		{"-nats", "nats://127.0.0.1:4222", "-redis", "127.0.0.1:6379", "-redis-prefix", ""},
		{"-nats", "nats://127.0.0.1:4222", "-discovery-interval", "2s", "-discovery-timeout", "1s"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

package main

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// startNATS starts an embedded nats-server on port (-1: any) of loopback.
func startNATS(t *testing.T, port int) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	return ns
}

// TestNATSDownFailsFast: while the gateway's NATS connection has been
// down longer than its reconnect grace (1 s here), a request is answered
// 503 with Retry-After at once — not after the grace on the instance
// still registered, nor after the balancer's wait for an instance once
// discovery dropped it — and once NATS is back requests are served again.
func TestNATSDownFailsFast(t *testing.T) {
	ns := startNATS(t, -1)
	port := ns.Addr().(*net.TCPAddr).Port
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()

	inc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inc.Close)
	serveInstance(t, inc, "node-1")

	addr, stop := startGateway(t, "-nats", ns.ClientURL(), "-nats-reconnect-grace", "1s", "-discovery-interval", "200ms", "-discovery-timeout", "1s")
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	url := "http://" + addr + "/v1/completions"
	body := `{"model":"tiny","prompt":"hi","max_tokens":2}`
	serves := func(within time.Duration) {
		t.Helper()
		for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
			code, b := call(t, client, http.MethodPost, url, "", body)
			if code == http.StatusOK {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("not served within %v: %d %s", within, code, b)
			}
		}
	}
	serves(10 * time.Second)

	ns.Shutdown()
	ns.WaitForShutdown()
	time.Sleep(1200 * time.Millisecond) // past the grace; the instance is still registered
	// Until well after discovery dropped the instance (1 s), every
	// request is refused at once.
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		began := time.Now()
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(began)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || took > 500*time.Millisecond {
			t.Fatalf("with NATS down: %d (Retry-After %q) after %v: %s; want 503 with Retry-After at once",
				resp.StatusCode, resp.Header.Get("Retry-After"), took, b)
		}
		if !strings.Contains(string(b), "NATS connection") {
			t.Errorf("the refusal does not say why: %s", b)
		}
	}

	ns = startNATS(t, port)
	serves(10 * time.Second)
	stop()
}

package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestServeAndShutdown runs the example on the simulated engine: it serves
// chat, models, ready and Prometheus metrics, and on shutdown lets a
// stream in flight finish before it exits.
func TestServeAndShutdown(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listening := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-engine", "sim", "-sim-step", "2ms"}, io.Discard, listening)
	}()
	var addr string
	select {
	case addr = <-listening:
	case err := <-done:
		t.Fatalf("server exited: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("server did not start")
	}
	base := "http://" + addr
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for path, want := range map[string]string{"/v1/models": `"id":"tiny"`, "/ready": `"ready"`, "/health": `"ok"`} {
		resp, err := client.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
		}
	}

	// A stream of 100 tokens at 2 ms a step is in flight when shutdown starts.
	resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"model":"tiny","stream":true,"max_tokens":100,"ignore_eos":true,"messages":[{"role":"user","content":"Hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() {
		t.Fatal("no first chunk")
	}
	metrics := get(t, client, base+"/metrics")
	for _, name := range []string{"mlxserving_http_requests_total", "mlxserving_sequences_running", "mlxserving_time_to_first_token_seconds_bucket"} {
		if !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	cancel()
	var last string
	for sc.Scan() {
		if line := sc.Text(); line != "" {
			last = line
		}
	}
	if last != "data: [DONE]" {
		t.Fatalf("the in-flight stream was cut off at shutdown; last line %q", last)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("server did not stop")
	}
	if _, err := client.Get(base + "/health"); err == nil {
		t.Fatal("server still accepts connections after shutdown")
	}
}

func get(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-engine", "gpu"}, {"extra"}, {"-nope"}, {"-cache-bytes", "1000"}, {"-merge", "-cache-ttl", "0s"}, {"-stall-deadline", "-1s"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

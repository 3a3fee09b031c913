package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mlxserving/mlxserving/internal/syncbuf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestPrewarmAndServe runs the example on the simulated engine: chat
// warms first, the server answers for both models, progress is printed.
func TestPrewarmAndServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out syncbuf.Buffer
	listening := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-engine", "sim"}, &out, listening) }()
	var addr string
	select {
	case addr = <-listening:
	case err := <-done:
		t.Fatalf("exited: %v\n%s", err, out.String())
	case <-time.After(30 * time.Second):
		t.Fatal("did not start")
	}
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for _, model := range []string{"chat", "code"} {
		resp, err := client.Post("http://"+addr+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"`+model+`","prompt":"hi","max_tokens":3}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", model, resp.StatusCode, body)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "pre-warming done: 2 of 2") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	text := out.String()
	chatReady, codeLoading := strings.Index(text, "chat  ready"), strings.Index(text, "code  loading")
	if chatReady < 0 || codeLoading < 0 || chatReady > codeLoading || !strings.Contains(text, "pre-warming done: 2 of 2") {
		t.Fatalf("progress out of order or missing:\n%s", text)
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-engine", "gpu"}, {"extra"}, {"-parallel", "x"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCluster runs the cluster briefly: 3 instances on the simulated
// engine found over embedded NATS, chat and completions through the
// balancer's OpenAI endpoint, vLLM-named gauges,
// and a clean shutdown.
func TestCluster(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var logs syncBuffer
	listening := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-sim-step", "0"}, &logs, listening) }()
	var addr string
	select {
	case addr = <-listening:
	case err := <-done:
		t.Fatalf("run: %v\n%s", err, logs.String())
	case <-time.After(30 * time.Second):
		t.Fatal("cluster did not start")
	}
	base := "http://" + addr
	for i := range 6 {
		path, body := "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"temperature":0,"ignore_eos":true}`
		if i%2 == 1 {
			path, body = "/v1/completions", `{"model":"tiny","prompt":"Once upon","max_tokens":8,"temperature":0,"ignore_eos":true,"stream":true}`
		}
		resp, err := http.Post(base+path, "application/json", bytes.NewReader([]byte(body)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		if i%2 == 0 {
			var c struct {
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal(b, &c); err != nil || c.Usage.CompletionTokens != 8 {
				t.Fatalf("chat body %s: %v", b, err)
			}
		} else if !strings.HasSuffix(strings.TrimSpace(string(b)), "data: [DONE]") {
			t.Fatalf("stream did not end with [DONE]: %s", b)
		}
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"} {
		if !strings.Contains(string(m), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("cluster did not stop")
	}
	out := logs.String()
	for _, want := range []string{"SIMULATED ENGINE", "instance=instance-3", "discovery: instance found"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q", want)
		}
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-instances", "0"}, {"-engine", "gpu"}, {"-sim-step", "-1s"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

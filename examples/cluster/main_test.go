package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mlxserving/mlxserving/internal/syncbuf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startCluster runs the cluster with args until the test ends and returns
// its HTTP address, the log buffer and a stop function that waits for run.
func startCluster(t *testing.T, args ...string) (string, *syncbuf.Buffer, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncbuf.Buffer{}
	listening := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, append([]string{"-addr", "127.0.0.1:0"}, args...), logs, listening) }()
	stop := func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(30 * time.Second):
			t.Error("cluster did not stop")
		}
	}
	select {
	case addr := <-listening:
		return addr, logs, stop
	case err := <-done:
		cancel()
		t.Fatalf("run: %v\n%s", err, logs.String())
	case <-time.After(60 * time.Second):
		stop()
		t.Fatal("cluster did not start")
	}
	return "", nil, nil
}

// TestClusterPyproc runs one instance on the Python engine (the tiny
// checkpoint on PyTorch) when MLXSERVING_PYTHON names an interpreter with
// torch, and answers a chat through the balancer.
func TestClusterPyproc(t *testing.T) {
	py := os.Getenv("MLXSERVING_PYTHON")
	if py == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("MLXSERVING_PYTHON is not set: source scripts/setup.d/30-python.sh")
		}
		t.Skip("MLXSERVING_PYTHON is not set (scripts/setup.d/30-python.sh installs python3-torch)")
	}
	addr, logs, stop := startCluster(t, "-engine", "pyproc", "-python", py, "-instances", "1")
	defer stop()
	body := `{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":4,"ignore_eos":true}`
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"completion_tokens":4`) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if strings.Contains(logs.String(), "SIMULATED ENGINE") {
		t.Error("pyproc cluster logged the simulated engine")
	}
}

// TestCluster runs the cluster briefly: 3 instances on the simulated
// engine found over embedded NATS, chat and completions through the
// balancer's OpenAI endpoint, vLLM-named gauges,
// and a clean shutdown.
func TestCluster(t *testing.T) {
	addr, logs, stop := startCluster(t, "-sim-step", "0")
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
	for _, name := range []string{"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "mlxserving_lb_requests", "mlxserving_breaker_state"} {
		if !strings.Contains(string(m), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	stop()
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

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
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
	case <-time.After(2 * time.Minute): // Python workers start in seconds, slower on a loaded machine
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
	for _, name := range []string{"mlxserving_http_requests_total", "mlxserving_sequences_running", "mlxserving_time_to_first_token_seconds_bucket",
		`vllm:num_requests_running{model_name="`, "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:cache_config_info"} {
		if !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %s:\n%s", name, metrics)
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
	for _, args := range [][]string{{"-engine", "gpu"}, {"extra"}, {"-nope"}, {"-cache-bytes", "1000"}, {"-merge", "-cache-ttl", "0s"}, {"-stall-deadline", "-1s"},
		{"-instance", "x"}, {"-nats", "nats://127.0.0.1:4222", "-nats-cert", "c.pem"}, {"-nats", "nats://127.0.0.1:4222", "-nats-drain-notice", "-1s"},
		{"-nats", "nats://127.0.0.1:4222", "-nats-heartbeat", "0s"}, {"-kv-cache-dtype", "bogus"}, {"-kv-cache-dtype", "fp8", "-engine", "mlx"},
		{"-trace-steps", "5"}, {"-trace-dir", "/tmp/t", "-trace-steps", "-1"}, {"-trace-dir", "/tmp/t", "-trace-skip", "-1"}, {"-trace-dir", "/tmp/t", "-trace-skip", "5"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

func TestGPUFlags(t *testing.T) {
	o, err := parseFlags([]string{"-gpus", "0, 1,2,3", "-tp", "2"})
	if err != nil || o.tp != 2 || !slices.Equal(o.gpus, []int{0, 1, 2, 3}) {
		t.Fatalf("-gpus 0,1,2,3 -tp 2: %+v, %v", o, err)
	}
	for _, args := range [][]string{{"-gpus", "0,x"}, {"-gpus", "-1"}, {"-tp", "0"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

func TestPrewarmAndBudgetFlags(t *testing.T) {
	o, err := parseFlags([]string{"-prewarm", "a=/m/a:5, b=/m/b", "-memory-budget", "1.5GiB"})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.prewarm) != 2 || o.prewarm[0].Spec.ID != "a" || o.prewarm[0].Spec.Path != "/m/a" || o.prewarm[0].Priority != 5 ||
		o.prewarm[1].Spec.Path != "/m/b" || o.prewarm[1].Priority != 0 {
		t.Fatalf("prewarm %+v", o.prewarm)
	}
	if o.memoryBudget != 3<<29 {
		t.Fatalf("budget %d", o.memoryBudget)
	}
	for _, in := range []string{"8GB", "8000000000", "8 GB"} {
		if n, err := parseBytes(in); err != nil || n != 8e9 {
			t.Errorf("parseBytes(%q) = %d, %v", in, n, err)
		}
	}
	for _, args := range [][]string{{"-prewarm", "noequals"}, {"-prewarm", "a=/x:high"}, {"-prewarm", "=dir"},
		{"-memory-budget", "lots"}, {"-memory-budget", "-1"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

// TestServePrewarmed runs the example on the simulated engine with a
// second model pre-warmed under a budget: both are listed with their
// state and serve.
func TestServePrewarmed(t *testing.T) {
	dir := t.TempDir()
	if err := writeTestModel(dir); err != nil {
		t.Fatal(err)
	}
	addr, stop := startRun(t, "-addr", "127.0.0.1:0", "-engine", "sim", "-prewarm", "second="+dir+":3", "-memory-budget", "1GiB")
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Post("http://"+addr+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"second","prompt":"hi","max_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("second model: %d %s", resp.StatusCode, body)
	}
	models := get(t, client, "http://"+addr+"/v1/models")
	for _, want := range []string{`"id":"second"`, `"id":"tiny"`, `"pinned":true`, `"state":"loaded"`} {
		if !strings.Contains(models, want) {
			t.Fatalf("/v1/models lacks %s: %s", want, models)
		}
	}
	metrics := get(t, client, "http://"+addr+"/metrics")
	for _, name := range []string{"mlxserving_model_loads_total", "mlxserving_model_load_duration_seconds_bucket",
		"mlxserving_models_loaded", "mlxserving_models_memory_used_bytes", "mlxserving_models_memory_budget_bytes{otel_scope_name=\"github.com/mlxserving/mlxserving/prewarm\",otel_scope_schema_url=\"\",otel_scope_version=\"\"} 1.073741824e+09"} {
		if !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %s:\n%s", name, metrics)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// startRun runs the example with args until stop, which returns what run
// returned; it fails t when the server does not start.
func startRun(t *testing.T, args ...string) (addr string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	listening := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, io.Discard, listening) }()
	select {
	case addr = <-listening:
	case err := <-done:
		t.Fatalf("server exited: %v", err)
	case <-time.After(2 * time.Minute): // Python workers start in seconds, slower on a loaded machine
		t.Fatal("server did not start")
	}
	return addr, func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return errors.New("server did not stop")
		}
	}
}

// TestTextSerial: -text-serial (each token's text work before the next
// step) streams the same completion as the default (behind the next
// step).
func TestTextSerial(t *testing.T) {
	var got []string
	for _, extra := range [][]string{nil, {"-text-serial"}} {
		addr, stop := startRun(t, append([]string{"-addr", "127.0.0.1:0", "-engine", "sim"}, extra...)...)
		client := &http.Client{Transport: &http.Transport{}}
		resp, err := client.Post("http://"+addr+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"tiny","prompt":"hello there","max_tokens":12,"stream":true,"temperature":0}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		client.CloseIdleConnections()
		if resp.StatusCode != 200 || !strings.Contains(string(body), "[DONE]") {
			t.Fatalf("%v: %d %s", extra, resp.StatusCode, body)
		}
		var text strings.Builder
		for line := range strings.SplitSeq(string(body), "\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			var ev struct {
				Choices []struct{ Text string } `json:"choices"`
			}
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatalf("%v: %q: %v", extra, data, err)
			}
			for _, c := range ev.Choices {
				text.WriteString(c.Text)
			}
		}
		got = append(got, text.String())
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	if got[0] == "" || got[0] != got[1] {
		t.Errorf("default streamed %q, -text-serial %q", got[0], got[1])
	}
}

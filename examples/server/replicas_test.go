package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/mlxserving/mlxserving/testmodel"
)

// TestServeReplicas: -gpus 0,1 -tp 1 serves two replicas, each its own
// Python engine and Server, behind the in-process balancer: both load the
// model and the -lora adapter, every request is counted once, under the
// replica that served it (/metrics), and an adapter loaded at run
// time serves on every replica. On a machine without CUDA the workers run
// on the CPU and CUDA_VISIBLE_DEVICES changes nothing.
func TestServeReplicas(t *testing.T) {
	py := testPython(t)
	dir := filepath.Join(t.TempDir(), "sql")
	if err := testmodel.WriteAdapter(dir, testmodel.Tiny(), testmodel.Adapter{Rank: 4}); err != nil {
		t.Fatal(err)
	}
	addr, stop := startRun(t, "-addr", "127.0.0.1:0", "-engine", "pyproc", "-python", py, "-gpus", "0,1", "-tp", "1", "-lora", "sql="+dir)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	base := "http://" + addr
	if models := get(t, client, base+"/v1/models"); !strings.Contains(models, `"id":"tiny"`) || !strings.Contains(models, `"id":"sql"`) {
		t.Fatalf("/v1/models: %s", models)
	}
	chat := func(model string, i int) error {
		resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(
			fmt.Sprintf(`{"model":%q,"max_tokens":3,"messages":[{"role":"user","content":"request %d of the replica test"}]}`, model, i)))
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("chat %s %d: %d %s", model, i, resp.StatusCode, body)
		}
		return nil
	}
	const n = 12
	before := requestsByReplica(t, get(t, client, base+"/metrics")) // pre-warming's warm-up requests
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = chat([]string{"tiny", "sql"}[i%2], i) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	metrics := get(t, client, base+"/metrics")
	after := requestsByReplica(t, metrics)
	if got := after["0"] - before["0"] + after["1"] - before["1"]; got != n {
		t.Errorf("requests by replica %v, before the test's %v: want %d more", after, before, n)
	}
	t.Logf("requests by replica (pre-warming's included): %v", after)
	for _, r := range []string{"0", "1"} {
		if !regexp.MustCompile(`mlxserving_sequences_running\{[^}]*replica="` + r + `"`).MatchString(metrics) {
			t.Errorf("no running-sequences gauge for replica %s", r)
		}
	}
	resp, err := client.Post(base+"/v1/load_lora_adapter", "application/json",
		strings.NewReader(fmt.Sprintf(`{"lora_name":"sql2","lora_path":%q}`, dir)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("load_lora_adapter: %d %s", resp.StatusCode, body)
	}
	for i := range 4 { // the balancer may send each to either replica
		if err := chat("sql2", i); err != nil {
			t.Fatal(err)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// requestsByReplica sums mlxserving_requests_total by replica; every
// point must have one.
func requestsByReplica(t *testing.T, metrics string) map[string]int {
	t.Helper()
	perReplica := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^mlxserving_requests_total\{([^}]*)\} (\d+)$`).FindAllStringSubmatch(metrics, -1) {
		r := regexp.MustCompile(`replica="(\d+)"`).FindStringSubmatch(m[1])
		if r == nil {
			t.Fatalf("a request count without its replica: %s", m[0])
		}
		v, _ := strconv.Atoi(m[2])
		perReplica[r[1]] += v
	}
	return perReplica
}

// TestReplicasStartFailure: an engine that cannot start (no such
// interpreter) makes run return the error, with one replica and with two
// (the first one's engine is closed again), never a crash.
func TestReplicasStartFailure(t *testing.T) {
	for _, gpus := range []string{"", "0,1"} {
		args := []string{"-addr", "127.0.0.1:0", "-engine", "pyproc", "-python", "/nonexistent/python3"}
		if gpus != "" {
			args = append(args, "-gpus", gpus, "-tp", "1")
		}
		err := run(context.Background(), args, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), "not found") {
			t.Errorf("-gpus %q with no interpreter: %v, want the engine's error", gpus, err)
		}
	}
}

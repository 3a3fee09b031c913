package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTraceEndpoint: with -trace-dir, POST /debug/trace?steps=N on the
// real Python engine answers once the worker has traced N steps of the
// load that runs meanwhile, with the trace's file (written in the
// directory) and its summary; a bad step count is refused; -trace-dir on
// an engine without traces fails at start.
func TestTraceEndpoint(t *testing.T) {
	py := testPython(t)
	dir := filepath.Join(t.TempDir(), "traces")
	addr, stop := startRun(t, "-addr", "127.0.0.1:0", "-engine", "pyproc", "-python", py, "-trace-dir", dir)
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	base := "http://" + addr

	if resp, err := client.Post(base+"/debug/trace?steps=0", "", nil); err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("steps=0: %v %v, want 400", resp, err)
	} else {
		resp.Body.Close()
	}

	type answer struct {
		status int
		body   []byte
		err    error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := client.Post(base+"/debug/trace?steps=6", "", nil)
		if err != nil {
			done <- answer{err: err}
			return
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- answer{resp.StatusCode, body, err}
	}()
	var got answer
	deadline := time.Now().Add(2 * time.Minute)
load:
	for i := 0; ; i++ {
		select {
		case got = <-done:
			break load
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no trace after two minutes of requests")
		}
		resp, err := client.Post(base+"/v1/completions", "application/json", strings.NewReader(
			fmt.Sprintf(`{"model":"tiny","prompt":"trace request %d","max_tokens":8,"ignore_eos":true}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if got.err != nil || got.status != http.StatusOK {
		t.Fatalf("POST /debug/trace: %d %s %v", got.status, got.body, got.err)
	}
	var reply traceReply
	if err := json.Unmarshal(got.body, &reply); err != nil {
		t.Fatal(err)
	}
	if len(reply.Traces) != 1 {
		t.Fatalf("%s: want one trace", got.body)
	}
	tr := reply.Traces[0]
	if _, err := os.Stat(tr.File); err != nil || filepath.Dir(tr.File) != dir {
		t.Errorf("trace file %q in %s: %v", tr.File, dir, err)
	}
	t.Logf("%s", tr.Summary)
	if !strings.Contains(tr.Summary, ": 6 steps over") {
		t.Errorf("summary %q: want 6 steps", tr.Summary)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := run(ctx, []string{"-addr", "127.0.0.1:0", "-engine", "sim", "-trace-dir", dir}, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "-trace-dir") {
		t.Errorf("-trace-dir on the simulated engine: %v, want an error naming the flag", err)
	}
}

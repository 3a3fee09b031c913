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
// directory) and its summary; on an idle server the timeout ends the
// trace, answered as incomplete; a bad step count or timeout is refused;
// -trace-dir on an engine without traces fails at start.
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

	for _, q := range []string{"steps=0", "steps=x", "timeout=-1s", "timeout=2h"} {
		if resp, err := client.Post(base+"/debug/trace?"+q, "", nil); err != nil || resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: %v %v, want 400", q, resp, err)
		} else {
			resp.Body.Close()
		}
	}
	// Idle: the timeout ends the trace, which recorded nothing.
	resp, err := client.Post(base+"/debug/trace?steps=5&timeout=300ms", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var idle traceReply
	if err := json.Unmarshal(body, &idle); err != nil || resp.StatusCode != http.StatusOK || idle.Complete || len(idle.Traces) != 1 ||
		idle.Traces[0].File != "" || !strings.HasSuffix(idle.Traces[0].Summary, "stopped before its first step") {
		t.Fatalf("an idle trace: %d %s (%v), want 200, complete false, nothing recorded", resp.StatusCode, body, err)
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
	if len(reply.Traces) != 1 || !reply.Complete {
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
	err = run(ctx, []string{"-addr", "127.0.0.1:0", "-engine", "sim", "-trace-dir", dir}, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "-trace-dir") {
		t.Errorf("-trace-dir on the simulated engine: %v, want an error naming the flag", err)
	}
}

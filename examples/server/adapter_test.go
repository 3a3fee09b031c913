package main

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/testmodel"
)

// TestServeAdapters starts the example with -lora: the adapter is listed
// with its parent and answers chat under its own name; bad -lora flags are
// refused.
func TestServeAdapters(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sql")
	if err := testmodel.WriteAdapter(dir, testmodel.Tiny(), testmodel.Adapter{Rank: 4}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"-lora", "nodir"}, {"-lora", "=x"}, {"-lora-slots", "-1"}, {"-max-lora-rank", "-2"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
	addr, stop := startRun(t, "-addr", "127.0.0.1:0", "-engine", "sim", "-lora", "sql="+dir, "-lora-slots", "2")
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	if models := get(t, client, "http://"+addr+"/v1/models"); !strings.Contains(models, `"id":"sql"`) || !strings.Contains(models, `"parent":"tiny"`) {
		t.Fatalf("/v1/models: %s", models)
	}
	resp, err := client.Post("http://"+addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"sql","max_tokens":4,"messages":[{"role":"user","content":"Hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"model":"sql"`) {
		t.Fatalf("chat with the adapter: %d %s", resp.StatusCode, body)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

package main

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/testmodel"
)

// TestServeAdapters starts the example with -lora and -lora-pinned: the
// adapters are listed with their parent (the pinned one as pinned) and
// answer chat under their own names; bad -lora flags are refused, and so
// is pinning every slot.
func TestServeAdapters(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sql")
	if err := testmodel.WriteAdapter(dir, testmodel.Tiny(), testmodel.Adapter{Rank: 4}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"-lora", "nodir"}, {"-lora", "=x"}, {"-lora-pinned", "x"}, {"-lora-slots", "-1"}, {"-max-lora-rank", "-2"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
	addr, stop := startRun(t, "-addr", "127.0.0.1:0", "-engine", "sim", "-lora", "sql="+dir, "-lora-pinned", "kept="+dir, "-lora-slots", "2")
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	models := get(t, client, "http://"+addr+"/v1/models")
	var list struct {
		Data []struct {
			ID, Parent string
			Pinned     bool
		}
	}
	if err := json.Unmarshal([]byte(models), &list); err != nil {
		t.Fatal(err)
	}
	adapters := map[string]bool{}
	for _, m := range list.Data {
		if m.Parent == "tiny" {
			adapters[m.ID] = m.Pinned
		}
	}
	if len(adapters) != 2 || adapters["sql"] || !adapters["kept"] {
		t.Fatalf("/v1/models: adapters (pinned) %v; want sql and kept (pinned): %s", adapters, models)
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

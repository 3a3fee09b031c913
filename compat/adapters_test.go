package compat_test

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestAdapterClient runs testdata/adapters.mjs: the npm openai client
// loads a LoRA adapter with POST /v1/load_lora_adapter, finds it in
// models.list() with its parent, chats with it (the reply equals what
// Server.Chat gives for the adapter, and differs from the base's), unloads
// it and gets a 404 for it afterwards.
func TestAdapterClient(t *testing.T) {
	node, openaiModules := nodeClient(t)
	adapter := filepath.Join(t.TempDir(), "sql")
	if err := testmodel.WriteAdapter(adapter, testmodel.Tiny(), testmodel.Adapter{Rank: 4}); err != nil {
		t.Fatal(err)
	}
	base, srv := startServerEmbed(t)
	cmd := exec.CommandContext(t.Context(), node, "testdata/adapters.mjs", openaiModules, base, adapter)
	out := output(t, "node adapters", cmd)
	var got struct {
		Loaded struct {
			ID     string
			Parent string
		}
		Models []struct {
			ID     string
			Parent *string
			Root   string
		}
		Chat struct {
			Model, Content string
		}
		BaseContent string
		AfterUnload int
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("node output %q: %v", out, err)
	}
	if got.Loaded.ID != "sql" || got.Loaded.Parent != "tiny" {
		t.Errorf("load_lora_adapter replied %+v", got.Loaded)
	}
	if len(got.Models) != 2 || got.Models[1].ID != "sql" || got.Models[1].Parent == nil || *got.Models[1].Parent != "tiny" ||
		got.Models[0].Parent != nil || got.Models[1].Root != "tiny" {
		t.Errorf("models.list: %+v", got.Models)
	}
	if got.Chat.Model != "sql" || got.Chat.Content == got.BaseContent {
		t.Errorf("chat with the adapter: %+v; the base said %q", got.Chat, got.BaseContent)
	}
	if got.AfterUnload != 404 {
		t.Errorf("chat after unload_lora_adapter: status %d, want 404", got.AfterUnload)
	}
	// What the adapter answers in process, loaded again after the
	// client's unload.
	if _, err := srv.LoadAdapter(context.Background(), adapterSpec("sql", adapter)); err != nil {
		t.Fatal(err)
	}
	st, err := srv.Chat(context.Background(), api.ChatRequest{Model: "sql", Messages: []api.Message{{Role: "user", Content: "Write a query."}},
		Params: api.Params{MaxTokens: 6}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := st.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if res.Text != got.Chat.Content {
		t.Errorf("the client read %q; the server answers %q", got.Chat.Content, res.Text)
	}
}

func adapterSpec(name, dir string) mlxserving.AdapterSpec {
	return mlxserving.AdapterSpec{Name: name, Path: dir}
}

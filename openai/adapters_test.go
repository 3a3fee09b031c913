package openai_test

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/mlxserving/mlxserving/testmodel"
)

// Adapters load and unload at run time through vLLM's endpoints (admin
// keys only), are listed with their parent, and serve completions under
// their own name.
func TestLoadLoRAAdapterEndpoints(t *testing.T) {
	f := keyedFixture(t)
	dir := filepath.Join(t.TempDir(), "sql")
	if err := testmodel.WriteAdapter(dir, testmodel.Tiny(), testmodel.Adapter{Rank: 4}); err != nil {
		t.Fatal(err)
	}
	load := map[string]any{"lora_name": "sql", "lora_path": dir}
	if status, _, body := f.post(t, "/v1/load_lora_adapter", load, bearer(normalKey)...); status != http.StatusForbidden || errCode(t, body) != "admin_required" {
		t.Fatalf("a normal key loading an adapter: %d %s", status, body)
	}
	for _, c := range []struct {
		body  any
		param string
	}{
		{map[string]any{"lora_path": dir}, "lora_name"},
		{map[string]any{"lora_name": "x", "lora_path": t.TempDir()}, "lora_path"},
		{map[string]any{"lora_name": "tiny", "lora_path": dir}, "lora_name"},
	} {
		status, _, body := f.post(t, "/v1/load_lora_adapter", c.body, bearer(adminKey)...)
		var e struct {
			Error struct{ Param string } `json:"error"`
		}
		_ = json.Unmarshal(body, &e)
		if status != http.StatusBadRequest || e.Error.Param != c.param {
			t.Errorf("load %v: %d %s; want 400 naming %s", c.body, status, body, c.param)
		}
	}
	load["pinned"] = true // kept in its device slot once resident
	status, _, body := f.post(t, "/v1/load_lora_adapter", load, bearer(adminKey)...)
	if status != http.StatusOK {
		t.Fatalf("load: %d %s", status, body)
	}
	var card struct {
		ID, Root string
		Parent   *string
		Rank     int `json:"lora_rank"`
		Pinned   bool
	}
	if err := json.Unmarshal(body, &card); err != nil || card.ID != "sql" || card.Parent == nil || *card.Parent != "tiny" || card.Root != "tiny" ||
		card.Rank != 4 || !card.Pinned {
		t.Fatalf("load reply %s (%v)", body, err)
	}
	req, _ := http.NewRequest(http.MethodGet, f.ts.URL+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := f.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct {
			ID     string
			Parent *string
			Pinned bool
		}
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil || len(list.Data) != 2 || list.Data[0].ID != "tiny" || list.Data[0].Parent != nil || list.Data[1].ID != "sql" ||
		*list.Data[1].Parent != "tiny" || !list.Data[1].Pinned {
		t.Fatalf("/v1/models: %+v (%v)", list, err)
	}
	chat := `{"model":"sql","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	status, _, body = f.post(t, "/v1/chat/completions", chat, bearer(normalKey)...)
	if status != http.StatusOK || decodeCompletion(t, body).Model != "sql" {
		t.Fatalf("chat with the adapter: %d %s", status, body)
	}
	if status, _, body := f.post(t, "/v1/unload_lora_adapter", map[string]any{"lora_name": "sql"}, bearer(adminKey)...); status != http.StatusOK {
		t.Fatalf("unload: %d %s", status, body)
	}
	if status, _, body := f.post(t, "/v1/unload_lora_adapter", map[string]any{"lora_name": "sql"}, bearer(adminKey)...); status != http.StatusNotFound {
		t.Fatalf("unload twice: %d %s", status, body)
	}
	if status, _, body := f.post(t, "/v1/chat/completions", chat, bearer(normalKey)...); status != http.StatusNotFound {
		t.Fatalf("chat with the unloaded adapter: %d %s", status, body)
	}
}

package compat_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/testmodel"
)

// startThinkingServer serves the test model with a chat template whose
// generation prompt opens a <think> block (as DeepSeek-R1's does) unless
// enable_thinking is false, when it closes an empty one (as Qwen3's does).
func startThinkingServer(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "tokenizer_config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	prompt := "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}"
	cfg["chat_template"] = strings.Replace(cfg["chat_template"].(string), "\\n\\n' }}{%- endif %}", "\\n\\n' }}"+prompt+"{%- endif %}", 1)
	if !strings.Contains(cfg["chat_template"].(string), "enable_thinking") {
		t.Fatalf("the test model's template changed: %q", cfg["chat_template"])
	}
	if data, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return startServerAt(t, dir, nil, nil)
}

// TestNodeReasoning runs testdata/reasoning.mjs: the npm openai client
// reads reasoning_content from a whole and a streamed reply (the
// simulated engine's tokens after the prompt's <think> are all
// reasoning), separate_reasoning false returns them as content, and
// chat_template_kwargs {"enable_thinking": false} reaches the template.
func TestNodeReasoning(t *testing.T) {
	node, modules := nodeClient(t)
	base := startThinkingServer(t)
	script, err := filepath.Abs("testdata/reasoning.mjs")
	if err != nil {
		t.Fatal(err)
	}
	out := output(t, "node reasoning", exec.CommandContext(t.Context(), node, script, modules, base))
	type split struct{ Reasoning, Content string }
	var got struct {
		Reasoning, RawReasoning, OffReasoning *string
		Content, Raw, OffContent              string
		Stream, OffStream                     split
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("node output %q: %v", out, err)
	}
	switch {
	case got.Raw == "" || got.RawReasoning != nil:
		t.Errorf("separate_reasoning false: %s", out)
	case got.Reasoning == nil || *got.Reasoning != got.Raw || got.Content != "":
		t.Errorf("whole reply: %s", out)
	case got.Stream != split{Reasoning: got.Raw}:
		t.Errorf("streamed reply: %s", out)
	case got.OffReasoning != nil || got.OffContent == "" || got.OffStream != split{Content: got.OffContent}:
		t.Errorf("enable_thinking false: %s", out)
	}
}

package compat_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/retry"
)

// nodeClient finds node and the npm "openai" package installed by
// scripts/setup.d/40-compat.sh. Missing pieces skip the test locally and
// fail it under CI.
func nodeClient(t *testing.T) (node, modules string) {
	t.Helper()
	missing := func(what string) {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s; run scripts/setup.d/40-compat.sh", what)
		}
		t.Skipf("%s; source scripts/setup.d/40-compat.sh to run this test", what)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node is not on PATH")
	}
	modules = os.Getenv("MLXSERVING_NPM_OPENAI")
	if modules == "" {
		missing("MLXSERVING_NPM_OPENAI is not set")
	}
	if _, err := os.Stat(filepath.Join(modules, "openai", "package.json")); err != nil {
		missing("the npm openai package is not installed in " + modules)
	}
	return node, modules
}

// TestNodeClient runs testdata/client.mjs with the npm openai client:
// chat (content parts), streaming with usage, completions, two errors and
// the model list.
func TestNodeClient(t *testing.T) {
	node, modules := nodeClient(t)
	base := startServer(t)
	script, err := filepath.Abs("testdata/client.mjs")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), node, script, modules, base)
	cmd.Env = append(os.Environ(), "OPENAI_API_KEY=unused")
	out := output(t, "node client", cmd)
	var got struct {
		Text, Streamed, Finish                string
		Chunks, StreamUsage, CompletionTokens int
		CachedTokens                          *int
		ErrorStatus, BadParamStatus           int
		ErrorCode, ErrorParam, BadParam       string
		Models                                []string
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("node output %q: %v", out, err)
	}
	switch {
	case got.Streamed != got.Text:
		t.Errorf("streamed %q, non-streamed %q", got.Streamed, got.Text)
	case got.Finish != "length" || got.StreamUsage != 10 || got.CompletionTokens != 4 || got.CachedTokens == nil:
		t.Errorf("finish/usage: %s", out)
	case got.ErrorStatus != 404 || got.ErrorCode != "model_not_found" || got.ErrorParam != "model":
		t.Errorf("unknown model error: %s", out)
	case got.BadParamStatus != 400 || got.BadParam != "top_p":
		t.Errorf("top_p error: %s", out)
	case !reflect.DeepEqual(got.Models, []string{"tiny"}):
		t.Errorf("models: %s", out)
	}
}

// TestNodeToolCalls runs testdata/tools.mjs: forced tool calls (whole and
// streamed), the call and a tool message sent back, and a json_schema
// response_format, through the npm openai client.
func TestNodeToolCalls(t *testing.T) {
	node, modules := nodeClient(t)
	base := startServer(t)
	script, err := filepath.Abs("testdata/tools.mjs")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), node, script, modules, base)
	out := output(t, "node tools", cmd)
	var got struct {
		Finish, Name, Args, ID               string
		StreamedName, StreamedArgs, StreamID string
		StreamFinish                         string
		StreamIndex                          int
		NextFinish, Structured               string
		StructuredFin                        string `json:"structuredFinish"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("node output %q: %v", out, err)
	}
	val := compileSchema(t, weatherParams)
	validate(t, val, got.Args)
	validate(t, val, got.StreamedArgs)
	validate(t, val, got.Structured)
	switch {
	case got.Finish != "tool_calls" || got.Name != "get_weather" || got.ID == "":
		t.Errorf("whole call: %s", out)
	case got.StreamFinish != "tool_calls" || got.StreamedName != "get_weather" || got.StreamIndex != 0 || got.StreamID == "":
		t.Errorf("streamed call: %s", out)
	case got.NextFinish == "" || got.StructuredFin != "stop":
		t.Errorf("follow-up or structured output: %s", out)
	}
}

// TestAgentFrameworks runs testdata/agents.mjs: LangChain JS bindTools and
// withStructuredOutput (both methods), and the Vercel AI SDK's
// generateText with a required tool call and generateObject, with zod
// schemas. Their packages come from scripts/setup.d/41-agents.sh.
func TestAgentFrameworks(t *testing.T) {
	node, _ := nodeClient(t)
	modules := os.Getenv("MLXSERVING_NPM_AGENTS")
	if _, err := os.Stat(filepath.Join(modules, "@langchain", "openai", "package.json")); modules == "" || err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("MLXSERVING_NPM_AGENTS is not set up; run scripts/setup.d/41-agents.sh")
		}
		t.Skip("MLXSERVING_NPM_AGENTS is not set up; source scripts/setup.d/41-agents.sh")
	}
	// ES modules resolve packages from the script's directory up.
	dir := t.TempDir()
	src, err := os.ReadFile("testdata/agents.mjs")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "agents.mjs"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(modules, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	base := startServer(t)
	cmd := exec.CommandContext(t.Context(), node, filepath.Join(dir, "agents.mjs"), base)
	out := output(t, "node agents", cmd)
	type call struct {
		Name string
		Args json.RawMessage
		ID   string
	}
	var got struct {
		Langchain           struct{ Calls []call }
		LangchainStructured json.RawMessage
		Aisdk               struct {
			Calls  []call
			Finish string
		}
		Zod struct {
			Array  []bool
			Checks map[string]bool
		}
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("node output %q: %v", out, err)
	}
	val := compileSchema(t, weatherParams)
	for what, calls := range map[string][]call{"langchain": got.Langchain.Calls, "ai sdk": got.Aisdk.Calls} {
		if len(calls) != 1 || calls[0].Name != "get_weather" || calls[0].ID == "" {
			t.Fatalf("%s: calls %s", what, out)
		}
		validate(t, val, string(calls[0].Args))
	}
	validate(t, val, string(got.LangchainStructured))
	if got.Aisdk.Finish != "tool-calls" {
		t.Errorf("ai sdk finish %q", got.Aisdk.Finish)
	}
	// zod v4 schemas with formats, records and nullables (profile), and
	// with unions, discriminated unions, defaults and arrays of objects
	// (order): accepted, and every object returned passes zod's own check.
	for _, path := range []string{"jsonSchema", "functionCalling", "generateObject"} {
		for _, key := range []string{path, "order/" + path} {
			if !got.Zod.Checks[key] {
				t.Errorf("zod schema through %s: %s", key, out)
			}
		}
	}
	// generateObject with output: 'array' and small maxOutputTokens:
	// the array is closed within the budget, so every object parses.
	if len(got.Zod.Array) != 3 || slices.Contains(got.Zod.Array, false) {
		t.Errorf("generateObject output array within maxOutputTokens: %v", got.Zod.Array)
	}
}

// TestNodeStreamCutByDeadline: the npm client surfaces a stream cut by the
// server's deadline as an APIError carrying the deadline's code, after the
// chunks that arrived.
func TestNodeStreamCutByDeadline(t *testing.T) {
	node, modules := nodeClient(t)
	base := startServerWith(t, []enginetest.SimOption{enginetest.WithStepTime(5*time.Millisecond, 0)},
		[]mlxserving.Option{mlxserving.WithDeadlines(retry.Deadlines{Total: 150 * time.Millisecond})})
	script, err := filepath.Abs("testdata/deadline.mjs")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), node, script, modules, base).Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	var got struct {
		Chunks int
		Error  *struct {
			IsAPIError bool
			Code, Type string
		}
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("node output %q: %v", out, err)
	}
	if got.Chunks == 0 || got.Error == nil || !got.Error.IsAPIError || got.Error.Code != "request_timeout" || got.Error.Type != "server_error" {
		t.Fatalf("npm client: %s", out)
	}
}

// output runs cmd and returns its standard output, failing t with both
// outputs when it fails.
func output(t *testing.T, what string, cmd *exec.Cmd) []byte {
	t.Helper()
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("%s: %v\n%s\n%s", what, err, out, stderr)
	}
	return out
}

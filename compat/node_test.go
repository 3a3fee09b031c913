package compat_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
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
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("node client: %v\n%s\n%s", err, out, stderr)
	}
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
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("node tools: %v\n%s\n%s", err, out, stderr)
	}
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

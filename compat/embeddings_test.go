package compat_test

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/mlxserving/mlxserving/api"
)

// TestEmbeddingClients runs testdata/embeddings.mjs: the npm openai
// client's embeddings.create (base64 by default, and float) and the AI
// SDK's embedMany and embed; every vector must equal what Server.Embed
// returns for the same text.
func TestEmbeddingClients(t *testing.T) {
	node, openaiModules := nodeClient(t)
	modules := os.Getenv("MLXSERVING_NPM_AGENTS")
	if _, err := os.Stat(filepath.Join(modules, "ai", "package.json")); modules == "" || err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("MLXSERVING_NPM_AGENTS is not set up; run scripts/setup.d/41-agents.sh")
		}
		t.Skip("MLXSERVING_NPM_AGENTS is not set up; source scripts/setup.d/41-agents.sh")
	}
	dir := t.TempDir()
	src, err := os.ReadFile("testdata/embeddings.mjs")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "embeddings.mjs"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(modules, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	base, srv := startServerEmbed(t)
	cmd := exec.CommandContext(t.Context(), node, filepath.Join(dir, "embeddings.mjs"), openaiModules, base)
	out := output(t, "node embeddings", cmd)
	var got struct {
		Openai struct {
			Vectors [][]float32
			Index   []int
			Usage   struct{ Prompt_tokens, Total_tokens int }
		}
		OpenaiFloat []float32
		EmptyStatus int
		EmptyParam  string
		Aisdk       struct {
			Vectors [][]float32
			Tokens  int
		}
		AisdkOne []float32
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("node output %q: %v", out, err)
	}
	texts := []string{"The quick brown fox", "jumps over the lazy dog", "The quick brown fox"}
	var inputs []api.EmbedInput
	for _, s := range texts {
		inputs = append(inputs, api.EmbedInput{Text: s})
	}
	want, err := srv.Embed(context.Background(), api.EmbedRequest{Model: "tiny", Inputs: inputs})
	if err != nil {
		t.Fatal(err)
	}
	same := func(what string, got, want []float32) {
		t.Helper()
		if len(got) != len(want) {
			t.Errorf("%s: %d values, want %d", what, len(got), len(want))
			return
		}
		for i := range got {
			if math.Abs(float64(got[i]-want[i])) > 1e-7 {
				t.Errorf("%s: value %d is %v, want %v", what, i, got[i], want[i])
				return
			}
		}
	}
	if len(got.Openai.Vectors) != 3 || len(got.Aisdk.Vectors) != 3 {
		t.Fatalf("vectors: %s", out)
	}
	for i := range texts {
		same("openai (base64) "+texts[i], got.Openai.Vectors[i], want.Vectors[i])
		same("ai sdk embedMany "+texts[i], got.Aisdk.Vectors[i], want.Vectors[i])
		if got.Openai.Index[i] != i {
			t.Errorf("index %d is %d", i, got.Openai.Index[i])
		}
	}
	same("openai float", got.OpenaiFloat, want.Vectors[0])
	same("ai sdk embed", got.AisdkOne, want.Vectors[1])
	if got.Openai.Usage.Prompt_tokens != want.PromptTokens || got.Aisdk.Tokens != want.PromptTokens {
		t.Errorf("usage: openai %d, ai sdk %d; the server counted %d", got.Openai.Usage.Prompt_tokens, got.Aisdk.Tokens, want.PromptTokens)
	}
	if got.EmptyStatus != 400 || got.EmptyParam != "input" {
		t.Errorf("an empty input: status %d param %q; want 400 on input", got.EmptyStatus, got.EmptyParam)
	}
}

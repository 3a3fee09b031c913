package mlxserving_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/engine/grammar"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestJSONSchemaRequests: JSONSchema constrains Generate and Chat; the
// server's grammar limits bound free strings; bad schemas and forced
// tools naming no tool are refused with *engine.InvalidParamError; a
// model without a tokenizer refuses constrained output.
func TestJSONSchemaRequests(t *testing.T) {
	dir := t.TempDir()
	cfg := testmodel.Tiny()
	if err := testmodel.Write(dir, cfg); err != nil {
		t.Fatal(err)
	}
	sim, err := enginetest.NewSim(enginetest.WithVocabSize(cfg.Vocab), enginetest.WithContextLength(512))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mlxserving.New(sim, mlxserving.WithGrammarLimits(grammar.Limits{MaxItems: -1})); err == nil {
		t.Fatal("negative grammar limit accepted")
	}
	srv, err := mlxserving.New(sim, mlxserving.WithGrammarLimits(grammar.Limits{MaxStringLength: 5}))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	defer srv.Close()
	ctx := context.Background()
	if err := srv.LoadModel(ctx, engine.ModelSpec{ID: "tiny", Path: dir}); err != nil {
		t.Fatal(err)
	}
	schema := []byte(`{"type":"object","properties":{"s":{"type":"string"},"n":{"type":"integer"}},"required":["s","n"]}`)
	for seed := uint64(0); seed < 5; seed++ {
		p := api.Params{MaxTokens: 200, JSONSchema: schema, Sampling: engine.SamplingParams{Temperature: 1, Seed: seed, HasSeed: true}}
		st, err := srv.Generate(ctx, api.Request{Model: "tiny", Prompt: "JSON:", Params: p})
		if err != nil {
			t.Fatal(err)
		}
		res, err := st.Collect()
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			S *string `json:"s"`
			N *int64  `json:"n"`
		}
		if res.Finish != api.FinishStop || json.Unmarshal([]byte(res.Text), &out) != nil || out.S == nil || out.N == nil {
			t.Fatalf("seed %d: finish %q, %q", seed, res.Finish, res.Text)
		}
		if n := len([]rune(*out.S)); n > 5 {
			t.Fatalf("seed %d: string of %d characters under MaxStringLength 5: %q", seed, n, res.Text)
		}
	}
	var ip *engine.InvalidParamError
	_, err = srv.Generate(ctx, api.Request{Model: "tiny", Prompt: "x", Params: api.Params{MaxTokens: 5, JSONSchema: []byte(`{"not":{}}`)}})
	if !errors.As(err, &ip) || !errors.Is(err, engine.ErrInvalidParam) {
		t.Fatalf("unsupported schema: %v", err)
	}
	_, err = srv.Chat(ctx, api.ChatRequest{Model: "tiny", Messages: []api.Message{{Role: "user", Content: "hi"}},
		ForceTool: "missing", ForceTools: []api.ToolSpec{{Name: "f"}}, Params: api.Params{MaxTokens: 5}})
	if !errors.As(err, &ip) || ip.Param != "tool_choice" {
		t.Fatalf("forced tool not among the tools: %v", err)
	}
	st, err := srv.Chat(ctx, api.ChatRequest{Model: "tiny", Messages: []api.Message{{Role: "user", Content: "hi"}},
		ForceTool: "*", ForceTools: []api.ToolSpec{{Name: "f", Parameters: []byte(`{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]}`)}},
		Params: api.Params{MaxTokens: 100}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := st.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if h := st.Header(); h.ToolFormat != "llama3" || !h.ToolForced || res.Finish != api.FinishStop {
		t.Fatalf("forced call: header %+v, finish %q, %q", h, res.Finish, res.Text)
	}
	var call struct {
		Name string          `json:"name"`
		Args map[string]bool `json:"parameters"`
	}
	if json.Unmarshal([]byte(res.Text), &call) != nil || call.Name != "f" || len(call.Args) != 1 {
		t.Fatalf("forced call text %q", res.Text)
	}

	// Token-id-only models refuse constrained output.
	bare, err := mlxserving.New(sim)
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	if err := bare.LoadModel(ctx, engine.ModelSpec{ID: "bare"}); err != nil {
		t.Fatal(err)
	}
	_, err = bare.Generate(ctx, api.Request{Model: "bare", PromptTokens: []int32{1, 2}, Params: api.Params{MaxTokens: 5, JSONSchema: grammar.AnyObject}})
	if !errors.Is(err, mlxserving.ErrNoTokenizer) {
		t.Fatalf("constrained output without a tokenizer: %v", err)
	}
}

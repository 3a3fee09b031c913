package mlxserving_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/engine/tokenizer"
	"github.com/mlxserving/mlxserving/testmodel"
)

// setTemplate replaces the checkpoint's chat template.
func setTemplate(t *testing.T, dir, tpl string) {
	t.Helper()
	path := filepath.Join(dir, "tokenizer_config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m["chat_template"] = tpl
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestChatKeepsTemplateErrors: a template that fails for one request gives
// an InvalidParamError that still is the tokenizer's *TemplateError, and
// the Server keeps serving.
func TestChatKeepsTemplateErrors(t *testing.T) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	setTemplate(t, dir, `{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}{{ m.content }}{% endfor %}`)
	sim, err := enginetest.NewSim(enginetest.WithVocabSize(testmodel.Tiny().Vocab), enginetest.WithContextLength(512))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	srv, err := mlxserving.New(sim)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir}); err != nil {
		t.Fatal(err)
	}
	req := api.ChatRequest{Model: "tiny", Messages: []api.Message{{Role: "tool", Content: "x"}}, Params: api.Params{MaxTokens: 2}}
	_, err = srv.Chat(context.Background(), req)
	var tplErr *tokenizer.TemplateError
	var invalid *engine.InvalidParamError
	if !errors.Is(err, tokenizer.ErrTemplate) || !errors.As(err, &tplErr) || !errors.As(err, &invalid) || invalid.Param != "messages" {
		t.Fatalf("chat with a raising template: %v (%T)", err, err)
	}
	req.Messages[0].Role = "user"
	st, err := srv.Chat(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Collect(); err != nil {
		t.Fatal(err)
	}
	// Invalid UTF-8 in a text prompt keeps its tokenizer error too.
	if _, err := srv.Generate(context.Background(), api.Request{Model: "tiny", Prompt: "a\xffb", Params: api.Params{MaxTokens: 2}}); !errors.Is(err, tokenizer.ErrInvalidUTF8) || !errors.Is(err, engine.ErrInvalidParam) {
		t.Fatalf("bad UTF-8 prompt: %v", err)
	}
}

// slowLoader is the simulated engine behind a Load that holds on until
// released, ignoring cancellation, as a real engine deep in a checkpoint
// read may.
type slowLoader struct {
	*enginetest.Sim
	loading chan struct{}
	release chan struct{}
}

func (e *slowLoader) Load(_ context.Context, spec engine.ModelSpec) (engine.Model, error) {
	close(e.loading)
	<-e.release
	return e.Sim.Load(context.Background(), spec)
}

// TestCloseWaitsForLoadModel: Close returns only after a LoadModel in
// flight has returned and freed what it loaded.
func TestCloseWaitsForLoadModel(t *testing.T) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	sim, err := enginetest.NewSim(enginetest.WithVocabSize(testmodel.Tiny().Vocab))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	eng := &slowLoader{Sim: sim, loading: make(chan struct{}), release: make(chan struct{})}
	srv, err := mlxserving.New(eng)
	if err != nil {
		t.Fatal(err)
	}
	loaded := make(chan error, 1)
	go func() { loaded <- srv.LoadModel(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir}) }()
	<-eng.loading
	// While it loads, it is not listed as loaded, and nothing panics.
	if len(srv.Models()) != 0 || len(srv.Stats()) != 0 {
		t.Fatalf("a loading model is listed: %v", srv.Models())
	}
	closed := make(chan error, 1)
	go func() { closed <- srv.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while LoadModel was still loading", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(eng.release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if n := sim.Stats().Models; n != 0 {
		t.Fatalf("%d engine models still open after Close", n)
	}
	if err := <-loaded; !errors.Is(err, mlxserving.ErrServerClosed) {
		t.Fatalf("LoadModel during Close: %v, want ErrServerClosed", err)
	}
}

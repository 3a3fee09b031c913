package mlxserving_test

import (
	"context"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/engine/tokenizer"
	"github.com/mlxserving/mlxserving/testmodel"
)

// tokenizerServer serves the checkpoint in dir (its tokenizer; the weights are
// not read) as model "tiny" over a simulated engine, both closed at
// cleanup.
func tokenizerServer(t *testing.T, dir string, simOpts []enginetest.SimOption, opts ...mlxserving.Option) *mlxserving.Server {
	t.Helper()
	sim, err := enginetest.NewSim(simOpts...)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := mlxserving.New(sim, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Close()
		_ = sim.Close()
	})
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir}); err != nil {
		t.Fatal(err)
	}
	return srv
}

// tinyCheckpoint writes the project's test checkpoint to a temporary
// directory and loads its tokenizer.
func tinyCheckpoint(t *testing.T) (string, *tokenizer.Tokenizer) {
	t.Helper()
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, tok
}

// chatFixture serves the project's test checkpoint's tokenizer and chat
// template over the simulated engine, whose pseudo-tokens stay inside the
// tokenizer's vocabulary.
func chatFixture(t *testing.T) (*mlxserving.Server, *tokenizer.Tokenizer) {
	t.Helper()
	dir, tok := tinyCheckpoint(t)
	srv := tokenizerServer(t, dir, []enginetest.SimOption{enginetest.WithVocabSize(tok.VocabSize()), enginetest.WithContextLength(512)})
	return srv, tok
}

func TestChatRendersTemplateAndDetokenizes(t *testing.T) {
	srv, tok := chatFixture(t)
	chat := api.ChatRequest{Model: "tiny",
		Messages: []api.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hello there"}},
		Params:   api.Params{MaxTokens: 40, IgnoreEOS: true}}
	st, err := srv.Chat(context.Background(), chat)
	if err != nil {
		t.Fatal(err)
	}
	res, err := st.Collect()
	if err != nil {
		t.Fatal(err)
	}
	want, err := tok.Decode(res.Tokens, true)
	if err != nil {
		t.Fatal(err)
	}
	if res.Text != want {
		t.Fatalf("streamed text %q, decode of the tokens %q", res.Text, want)
	}
	rendered, _ := tok.ApplyChatTemplate(chat.Messages, tokenizer.ChatOptions{AddGenerationPrompt: true})
	prompt, _ := tok.Encode(rendered, false)
	if res.Usage.PromptTokens != len(prompt) {
		t.Fatalf("prompt tokens %d, template renders %d", res.Usage.PromptTokens, len(prompt))
	}

	// A stop string taken from that output ends the text right before it.
	runes := []rune(res.Text)
	if len(runes) < 8 {
		t.Skipf("output too short to pick a stop string: %q", res.Text)
	}
	stop := string(runes[4:7])
	chat.Stop = []string{stop}
	st, err = srv.Chat(context.Background(), chat)
	if err != nil {
		t.Fatal(err)
	}
	stopped, err := st.Collect()
	if err != nil {
		t.Fatal(err)
	}
	if wantText := res.Text[:strings.Index(res.Text, stop)]; stopped.Text != wantText || stopped.Finish != api.FinishStop {
		t.Fatalf("with stop %q: %q (%s), want %q", stop, stopped.Text, stopped.Finish, wantText)
	}
}

func TestTextPromptAndBadChat(t *testing.T) {
	srv, _ := chatFixture(t)
	st, err := srv.Generate(context.Background(), api.Request{Model: "tiny", Prompt: "Once upon a time",
		Params: api.Params{MaxTokens: 8, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := st.Collect(); err != nil || len(res.Tokens) != 8 {
		t.Fatalf("%d tokens, %v", len(res.Tokens), err)
	}
	if _, err := srv.Chat(context.Background(), api.ChatRequest{Model: "tiny", Params: api.Params{MaxTokens: 4}}); !isParam("messages")(err) {
		t.Fatalf("empty messages: %v", err)
	}
	if _, err := srv.Generate(context.Background(), api.Request{Model: "tiny", Prompt: "x",
		Params: api.Params{MaxTokens: 4, Stop: []string{""}}}); !isParam("stop")(err) {
		t.Fatalf("empty stop string: %v", err)
	}
}

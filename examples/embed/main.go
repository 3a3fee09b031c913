// Command embed is the smallest Go program that serves a model itself,
// without HTTP: start an engine, load a checkpoint, chat, stream the reply
// to stdout, shut down. Copy it as the start of your own program.
//
//	go run ./examples/embed -python /usr/bin/python3 -model /models/Llama-3.2-1B-Instruct
//
// Without -model it writes the project's generated test model (real
// architecture and tokenizer, random weights: expect gibberish) to a
// temporary directory. The Python engine needs python3 with torch (on
// Debian: apt-get install python3-torch).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/pyproc"
	"github.com/mlxserving/mlxserving/testmodel"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("embed", flag.ContinueOnError)
	model := fs.String("model", "", "Hugging Face-layout checkpoint directory (default: the generated test model)")
	python := fs.String("python", "python3", "python interpreter with torch")
	prompt := fs.String("prompt", "Write a haiku about Go.", "the user's message")
	maxTokens := fs.Int("max-tokens", 48, "most tokens to generate")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *model == "" {
		// The generated test model (the public testmodel package), so the
		// program runs as copied; pass -model for a real checkpoint.
		dir, err := os.MkdirTemp("", "mlxserving-embed-*")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
			return err
		}
		*model = dir
	}

	// 1. An engine: Python worker processes running the model.
	eng, err := pyproc.New(ctx, pyproc.WithPython(*python))
	if err != nil {
		return err
	}
	defer eng.Close()

	// 2. A Server over it, and a model loaded under an id.
	srv, err := mlxserving.New(eng)
	if err != nil {
		return err
	}
	defer srv.Close()
	if err := srv.LoadModel(ctx, engine.ModelSpec{ID: "model", Path: *model}); err != nil {
		return err
	}

	// 3. Chat: the reply streams in as it is generated.
	st, err := srv.Chat(ctx, api.ChatRequest{
		Model:    "model",
		Messages: []api.Message{{Role: "user", Content: *prompt}},
		Params:   api.Params{MaxTokens: *maxTokens, Priority: api.High},
	})
	if err != nil {
		return err
	}
	for chunk, err := range st.Chunks() {
		if err != nil {
			return err
		}
		fmt.Fprint(out, chunk.Text)
		if chunk.Finish != "" {
			fmt.Fprintf(out, "\n[finish: %s, %d prompt + %d generated tokens]\n",
				chunk.Finish, chunk.Usage.PromptTokens, chunk.Usage.CompletionTokens)
		}
	}

	// 4. Shut down: finish what is running (none here), unload the model.
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdownCtx)
}

package pyproc

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

func TestMissingInterpreter(t *testing.T) {
	for _, py := range []string{"/nonexistent/python3", "no-such-python-xyz"} {
		_, err := New(context.Background(), WithPython(py), WithCacheDir(t.TempDir()))
		if !errors.Is(err, engine.ErrUnavailable) || !strings.Contains(err.Error(), "install") {
			t.Errorf("%s: %v, want ErrUnavailable saying what to install", py, err)
		}
	}
}

func TestMissingBackend(t *testing.T) {
	// The mlx backend cannot import here: its refusal names the package.
	_, err := New(context.Background(), WithPython(python(t)), WithBackend("mlx"), WithCacheDir(t.TempDir()))
	if !errors.Is(err, engine.ErrUnavailable) || !strings.Contains(err.Error(), "mlx-lm") {
		t.Fatalf("mlx backend: %v, want ErrUnavailable naming mlx-lm", err)
	}
}

func TestOptionsRefuseBadValues(t *testing.T) {
	for _, o := range []Option{WithWorkers(0), WithBackend("jax"), WithDevice("tpu"), WithDType("int4"),
		WithStartTimeout(0), WithHeartbeat(0, 1), WithHeartbeat(2, 1), WithLogger(nil), WithPython(""),
		WithCacheDir(""), WithMaxLineBytes(10), WithThreads(-1), WithLookahead(-1), WithLookahead(65)} {
		if _, err := New(context.Background(), o); err == nil {
			t.Error("a bad option was accepted")
		}
	}
}

// badCheckpoint writes a tiny checkpoint and breaks it with edit.
func badCheckpoint(t *testing.T, edit func(dir string)) string {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	edit(dir)
	return dir
}

func editConfig(t *testing.T, dir string, key string, v any) {
	path := filepath.Join(dir, "config.json")
	var c map[string]any
	raw, _ := os.ReadFile(path)
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	c[key] = v
	raw, _ = json.Marshal(c)
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestBadCheckpoints(t *testing.T) {
	e := newEngine(t)
	cases := []struct {
		name, path, tensor string
		edit               func(dir string)
	}{
		{"missing config", "config.json", "", func(d string) { os.Remove(filepath.Join(d, "config.json")) }},
		{"missing tokenizer", "tokenizer.json", "", func(d string) { os.Remove(filepath.Join(d, "tokenizer.json")) }},
		{"missing weights", ".", "", func(d string) { os.Remove(filepath.Join(d, "model.safetensors")) }},
		{"unsupported architecture", "config.json", "", func(d string) { editConfig(t, d, "model_type", "gpt_neox") }},
		{"shapes contradict config", "model.safetensors", "model.embed_tokens.weight", func(d string) { editConfig(t, d, "hidden_size", 96) }},
		{"truncated weights", "model.safetensors", "", func(d string) {
			if err := os.Truncate(filepath.Join(d, "model.safetensors"), 5000); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		_, err := e.Load(context.Background(), engine.ModelSpec{ID: "bad", Path: badCheckpoint(t, tc.edit)})
		var ce *engine.CheckpointError
		if !errors.As(err, &ce) || !errors.Is(err, engine.ErrBadCheckpoint) {
			t.Errorf("%s: %v, want a CheckpointError", tc.name, err)
			continue
		}
		if ce.Path != tc.path || (tc.tensor != "" && ce.Tensor != tc.tensor) {
			t.Errorf("%s: %v names %q / %q, want %q / %q", tc.name, err, ce.Path, ce.Tensor, tc.path, tc.tensor)
		}
	}
	// The worker stays usable for other models.
	m := load(t, e, tiny(t))
	generate(t, m, 1, prompt(1, 5), 3)
}

// TestUnsupportedArchitecture checks the refusal names the families the
// runtime serves.
func TestUnsupportedArchitecture(t *testing.T) {
	e := newEngine(t)
	_, err := e.Load(context.Background(), engine.ModelSpec{ID: "bad", Path: badCheckpoint(t, func(d string) { editConfig(t, d, "model_type", "gpt_neox") })})
	if err == nil {
		t.Fatal("gpt_neox loaded")
	}
	for _, arch := range testmodel.TorchArchs() {
		if !strings.Contains(err.Error(), arch) {
			t.Errorf("%v: does not list %s", err, arch)
		}
	}
}

func TestLoadCancelled(t *testing.T) {
	e := newEngine(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.Load(ctx, engine.ModelSpec{ID: "tiny", Path: tiny(t)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled load: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Load(context.Background(), engine.ModelSpec{ID: "tiny", Path: tiny(t)}); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("load after Close: %v", err)
	}
}

// TestLoadRelativePath: a checkpoint named relative to this process's
// working directory loads (the worker runs in its runtime directory) and
// decodes as the same checkpoint named whole.
func TestLoadRelativePath(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(wd, tiny(t))
	if err != nil {
		t.Fatal(err)
	}
	m := load(t, newEngine(t), rel)
	if got, want := generate(t, m, 1, prompt(1, 9), 4), generate(t, load(t, newEngine(t), tiny(t)), 1, prompt(1, 9), 4); !slices.Equal(got, want) {
		t.Fatalf("from %s: %v, from the whole path %v", rel, got, want)
	}
}

// TestFitCheck runs testdata/fit_test.py: the weight bytes a load needs,
// read from the safetensors headers before loading (what a GPU's free
// memory is checked against), equal what the decoder holds, for a dense
// family, one with QK norm, a multimodal Gemma 3 checkpoint and gpt-oss's
// MXFP4 experts, and not counting weights the decoder does not read; the
// refusal names the gigabytes and what to do; and a GPU worker's torch
// CPU threads (one once a model runs on a GPU, every core while a later
// one loads, --threads kept).
func TestFitCheck(t *testing.T) {
	args := []string{"runtime"}
	oss := testmodel.TinyFamily("gpt_oss")
	oss.Quant = testmodel.QuantMXFP4
	for _, c := range []testmodel.Config{testmodel.TinyFamily("llama"), testmodel.TinyFamily("qwen3"), testmodel.TinyFamily("gemma3"), oss} {
		dir := filepath.Join(t.TempDir(), c.Arch)
		if err := testmodel.Write(dir, c); err != nil {
			t.Fatal(err)
		}
		args = append(args, dir)
	}
	runPyCheck(t, "testdata/fit_test.py", args...)
}

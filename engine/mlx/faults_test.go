//go:build mlx

package mlx

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/metal"
)

func TestPrefixReuse(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tinyDir(t, nil))
	ctx := context.Background()
	turn1 := prompts()[2]
	fresh, _ := generate(t, m, 9, append(slices.Clone(turn1), 7, 8, 9), 6, 100, nil)

	if _, err := m.Open(ctx, 1, turn1, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: turn1, Sample: true}}); err != nil {
		t.Fatal(err)
	}
	m.Free(1, "session-a")
	turn2 := append(slices.Clone(turn1), 7, 8, 9)
	reused, err := m.Open(ctx, 2, turn2, "session-a")
	if err != nil || reused != len(turn1) {
		t.Fatalf("Open reused %d, %v; want %d", reused, err, len(turn1))
	}
	out, err := m.Step(ctx, []engine.StepInput{{Seq: 2, Tokens: turn2[reused:], Sample: true}})
	if err != nil || out[0].Token != fresh[0] {
		t.Fatalf("after reuse: %v, %v; want first token %d", out, err, fresh[0])
	}
	m.Free(2, "")
	// The whole prompt saved: one token is left to feed.
	if r, err := m.Open(ctx, 3, turn1, "session-a"); err != nil || r != len(turn1)-1 {
		t.Fatalf("whole-prompt reuse = %d, %v; want %d", r, err, len(turn1)-1)
	}
	m.Free(3, "")
	// Reuse is the longest common prefix: a prompt that parts from the
	// saved tokens after its first token reuses that one token.
	vocab := int32(m.Info().VocabSize)
	parted := []int32{turn1[0], (turn1[1] + 1) % vocab, 3}
	if r, err := m.Open(ctx, 4, parted, "session-a"); err != nil || r != 1 {
		t.Fatalf("reuse of a prompt parting after one token = %d, %v; want 1", r, err)
	}
	m.Free(4, "")
	// A prompt whose first token differs reuses nothing.
	other := []int32{(turn1[0] + 1) % vocab, 2, 3}
	if r, err := m.Open(ctx, 5, other, "session-a"); err != nil || r != 0 {
		t.Fatalf("mismatched reuse = %d, %v; want 0", r, err)
	}
	m.Free(5, "")
}

func TestBadInput(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tinyDir(t, nil))
	ctx := context.Background()
	long := make([]int32, m.Info().ContextLength+1)
	var cle *engine.ContextLengthError
	if _, err := m.Open(ctx, 1, long, ""); !errors.As(err, &cle) {
		t.Fatalf("long prompt: %v", err)
	}
	if _, err := m.Open(ctx, 1, []int32{1, 2}, ""); err != nil {
		t.Fatal(err)
	}
	defer m.Free(1, "")
	for name, batch := range map[string][]engine.StepInput{
		"token out of range": {{Seq: 1, Tokens: []int32{int32(m.Info().VocabSize)}, Sample: true}},
		"negative token":     {{Seq: 1, Tokens: []int32{-1}}},
		"empty tokens":       {{Seq: 1}},
		"unknown seq":        {{Seq: 99, Tokens: []int32{1}}},
		"duplicate seq":      {{Seq: 1, Tokens: []int32{1}}, {Seq: 1, Tokens: []int32{2}}},
		"bad temperature":    {{Seq: 1, Tokens: []int32{1}, Sample: true, Params: &engine.SamplingParams{Temperature: 3}}},
	} {
		if _, err := m.Step(ctx, batch); !errors.Is(err, engine.ErrInvalidParam) {
			t.Errorf("%s: err = %v, want ErrInvalidParam", name, err)
		}
	}
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: long}}); !errors.As(err, &cle) {
		t.Errorf("context overflow in Step: %v", err)
	}
	// The sequence still works after refused steps.
	if out, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: []int32{1, 2}, Sample: true}}); err != nil || len(out) != 1 {
		t.Fatalf("after refusals: %v, %v", out, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := m.Step(cctx, []engine.StepInput{{Seq: 1, Tokens: []int32{3}, Sample: true}}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Step: %v", err)
	}
	if _, err := e.Load(cctx, engine.ModelSpec{ID: "x", Path: tinyDir(t, nil)}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Load: %v", err)
	}
}

// TestKVCapacity: the pool holds KVCapacity tokens; Open reserves none of
// them, a step that would feed past what is free fails with
// ErrOutOfMemory, and runs once another sequence is freed.
func TestKVCapacity(t *testing.T) {
	e := newEngine(t)
	mm, err := e.Load(context.Background(), engine.ModelSpec{ID: "small", Path: tinyDir(t, nil), KVCapacity: 600, MaxBatch: 2})
	if err != nil {
		t.Fatal(err)
	}
	m := mm.(*model)
	ctx := context.Background()
	if _, err := m.Open(ctx, 1, make([]int32, 400), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Open(ctx, 2, make([]int32, 300), ""); err != nil {
		t.Fatalf("Open takes no KV, yet: %v", err)
	}
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: make([]int32, 400)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 2, Tokens: make([]int32, 300)}}); !errors.Is(err, engine.ErrOutOfMemory) {
		t.Fatalf("feeding 300 tokens with 200 free: %v", err)
	}
	m.Free(1, "")
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 2, Tokens: make([]int32, 300)}}); err != nil {
		t.Fatalf("after Free: %v", err)
	}
	m.Free(2, "")
	in := []engine.StepInput{{Seq: 1, Tokens: []int32{1}}, {Seq: 2, Tokens: []int32{1}}, {Seq: 3, Tokens: []int32{1}}}
	if _, err := m.Step(ctx, in); !errors.Is(err, engine.ErrInvalidParam) {
		t.Fatalf("batch over MaxBatch: %v", err)
	}
}

// TestMLXErrorIsGoError provokes MLX errors (mismatched shapes, a bad
// reshape) on the engine's thread: they come back as errors with MLX's
// message, and the engine keeps serving.
func TestMLXErrorIsGoError(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tinyDir(t, nil))
	err := m.call(func(g *graph) error {
		a := g.float32s([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
		g.matmul(a, a)
		return g.err
	})
	if !errors.Is(err, metal.ErrMLX) || !strings.Contains(err.Error(), "matmul") {
		t.Fatalf("matmul of [2,3]x[2,3]: %v", err)
	}
	err = m.call(func(g *graph) error {
		g.reshape(g.float32s([]float32{1, 2, 3}, 3), 2, 2)
		return g.err
	})
	if !errors.Is(err, metal.ErrMLX) {
		t.Fatalf("bad reshape: %v", err)
	}
	if toks, _ := generate(t, m, 1, prompts()[0], 3, 100, nil); len(toks) != 3 {
		t.Fatal("engine stopped serving after MLX errors")
	}
}

func TestBadCheckpointKeepsServing(t *testing.T) {
	e := newEngine(t)
	good := load(t, e, tinyDir(t, nil))
	dir := tinyDir(t, nil)
	p := filepath.Join(dir, "model.safetensors")
	b, _ := os.ReadFile(p)
	os.WriteFile(p, b[:len(b)/2], 0o644)
	if _, err := e.Load(context.Background(), engine.ModelSpec{ID: "bad", Path: dir}); !errors.Is(err, engine.ErrBadCheckpoint) {
		t.Fatalf("truncated checkpoint: %v", err)
	}
	if _, err := e.Load(context.Background(), engine.ModelSpec{ID: "none", Path: t.TempDir()}); !errors.Is(err, engine.ErrBadCheckpoint) {
		t.Fatalf("empty dir: %v", err)
	}
	if toks, _ := generate(t, good, 1, prompts()[1], 3, 100, nil); len(toks) != 3 {
		t.Fatal("good model stopped")
	}
}

func TestCloseSemantics(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tinyDir(t, nil))
	ctx := context.Background()
	if _, err := m.Open(ctx, 1, []int32{1}, ""); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: []int32{1}}}); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("Step after Close: %v", err)
	}
	m.Free(1, "") // no-op
	m2 := load(t, e, tinyDir(t, nil))
	e.Close()
	if _, err := m2.Open(ctx, 1, []int32{1}, ""); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("Open after engine Close: %v", err)
	}
	if _, err := e.Load(ctx, engine.ModelSpec{ID: "x", Path: tinyDir(t, nil)}); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("Load after Close: %v", err)
	}
}

// TestSavedKVGivesWay lowers MLX's memory limit below what is in use: the
// next Open evicts saved prefixes, so their keys reuse nothing.
func TestSavedKVGivesWay(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tinyDir(t, nil))
	ctx := context.Background()
	p := prompts()[2]
	if _, err := m.Open(ctx, 1, p, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: p}}); err != nil {
		t.Fatal(err)
	}
	m.Free(1, "kept")
	mem, err := metal.ReadMemory()
	if err != nil {
		t.Fatal(err)
	}
	prev, err := metal.SetMemoryLimit(mem.Active)
	if err != nil {
		t.Fatal(err)
	}
	defer metal.SetMemoryLimit(prev)
	longer := append(slices.Clone(p), 5)
	if r, err := m.Open(ctx, 2, longer, "kept"); err != nil || r != 0 {
		t.Fatalf("under memory pressure Open reused %d, %v; want 0 (saved KV evicted)", r, err)
	}
	m.Free(2, "")
	if len(m.saved) != 0 {
		t.Fatalf("%d saved prefixes left", len(m.saved))
	}
}

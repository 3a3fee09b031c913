package pyproc

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/testmodel"
)

// hostileEncoderConfigs are edits of the encoders' own config.json
// fields that no real model has, or that ask for what the encoders do
// not implement: each is refused with a *engine.CheckpointError.
var hostileEncoderConfigs = []enginetest.HostileConfig{
	{Name: "heads do not divide hidden", Arch: "bert", Key: "num_attention_heads", Value: 5},
	{Name: "a million layers", Arch: "bert", Key: "num_hidden_layers", Value: 1 << 20},
	{Name: "no positions", Arch: "bert", Key: "max_position_embeddings", Value: 0},
	{Name: "vocabulary size not a number", Arch: "bert", Key: "vocab_size", Value: "big"},
	{Name: "relative positions", Arch: "bert", Key: "position_embedding_type", Value: "relative_key"},
	{Name: "tanh GELU", Arch: "bert", Key: "hidden_act", Value: "gelu_new"},
	{Name: "negative norm epsilon", Arch: "bert", Key: "layer_norm_eps", Value: -1e-12},
	{Name: "negative local window", Arch: "modernbert", Key: "local_attention", Value: -4},
	{Name: "global every 0 layers", Arch: "modernbert", Key: "global_attn_every_n_layers", Value: 0},
	{Name: "layer_types too short", Arch: "modernbert", Key: "layer_types", Value: []string{"full_attention"}},
	{Name: "unknown layer type", Arch: "modernbert", Key: "layer_types", Value: []string{"x", "x", "x"}},
	{Name: "rope theta not a number", Arch: "modernbert", Key: "global_rope_theta", Value: "x"},
	{Name: "attention biases", Arch: "modernbert", Key: "attention_bias", Value: true},
	{Name: "missing hidden size", Arch: "modernbert", Key: "hidden_size", Value: nil},
}

// TestHostileEncoderConfigs: every edit is refused as a CheckpointError,
// as is a sentence-transformers pipeline with a Dense module, and the
// worker goes on serving.
func TestHostileEncoderConfigs(t *testing.T) {
	e := newEngine(t)
	ctx := context.Background()
	for _, h := range hostileEncoderConfigs {
		dir := t.TempDir()
		if err := h.Write(dir); err != nil {
			t.Fatal(err)
		}
		m, err := e.Load(ctx, engine.ModelSpec{ID: "bad", Path: dir})
		if !errors.Is(err, engine.ErrBadCheckpoint) {
			t.Errorf("%s (%s): %v, want a CheckpointError", h.Name, h.Arch, err)
			if m != nil {
				m.Close()
			}
		}
	}
	dir := t.TempDir()
	c := testmodel.TinyFamily("bert")
	c.Embedding = &testmodel.Embedding{Pooling: "cls"}
	if err := testmodel.Write(dir, c); err != nil {
		t.Fatal(err)
	}
	mods := []map[string]any{
		{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
		{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
		{"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
	}
	raw, _ := json.Marshal(mods)
	if err := os.WriteFile(filepath.Join(dir, "modules.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	var ce *engine.CheckpointError
	if m, err := e.Load(ctx, engine.ModelSpec{ID: "dense", Path: dir}); !errors.As(err, &ce) {
		t.Errorf("a Dense module: %v, want a CheckpointError", err)
		if m != nil {
			m.Close()
		}
	}
	m := load(t, e, encoderDir(t, "bert"))
	defer m.Close()
	embedOne(t, m, 1, prompt(1, 9), engine.PoolCLS)
}

func encoderDir(t *testing.T, arch string) string {
	t.Helper()
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.TinyFamily(arch)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// embedOne embeds input alone, in one step.
func embedOne(t *testing.T, m *Model, seq engine.SeqID, input []int32, pool engine.Pooling) []float32 {
	t.Helper()
	ctx := context.Background()
	if err := m.OpenPooled(ctx, seq, input, pool); err != nil {
		t.Fatal(err)
	}
	defer m.Free(seq, "")
	out, err := m.Step(ctx, []engine.StepInput{{Seq: seq, Tokens: input, Sample: true}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || out[0].Token != -1 || len(out[0].Embedding) != m.Info().EmbedDim {
		t.Fatalf("outputs %+v", out)
	}
	return out[0].Embedding
}

// TestEmbedBadInput: what an embedding sequence cannot take is refused
// with a typed error, by the supervisor and, sent anyway, by the worker,
// which goes on serving.
func TestEmbedBadInput(t *testing.T) {
	e := newEngine(t)
	ctx := context.Background()
	enc := load(t, e, encoderDir(t, "modernbert"))
	defer enc.Close()
	var ip *engine.InvalidParamError
	if _, err := enc.Open(ctx, 1, prompt(1, 4), ""); !errors.As(err, &ip) {
		t.Errorf("Open on an encoder: %v, want an InvalidParamError", err)
	}
	if err := enc.OpenPooled(ctx, 1, prompt(1, 4), engine.PoolNone); !errors.As(err, &ip) {
		t.Errorf("PoolNone: %v, want an InvalidParamError", err)
	}
	var cl *engine.ContextLengthError
	if err := enc.OpenPooled(ctx, 1, prompt(1, enc.Info().ContextLength+1), engine.PoolMean); !errors.As(err, &cl) {
		t.Errorf("an input past the context: %v, want a ContextLengthError", err)
	}
	want := embedOne(t, enc, 1, prompt(2, 12), engine.PoolMean)

	// An encoder's input split over two steps.
	in := prompt(2, 12)
	if err := enc.OpenPooled(ctx, 2, in, engine.PoolMean); err != nil {
		t.Fatal(err)
	}
	if _, err := enc.Step(ctx, []engine.StepInput{{Seq: 2, Tokens: in[:5]}}); !errors.As(err, &ip) {
		t.Errorf("half an encoder input: %v, want an InvalidParamError", err)
	}
	// The same, past the supervisor's check: the worker refuses it.
	p := enc.seqs[2].proc
	_, err := p.call(ctx, "tiny", request("step", map[string]any{"model": enc.handle,
		"batch": []any{[]any{2, in[:5], false, map[string]any{}}}}))
	var we *WorkerError
	if !errors.As(err, &we) || we.Code != retry.CodeInvalidValue || !errors.Is(err, engine.ErrInvalidParam) {
		t.Errorf("the worker took half an encoder input: %v", err)
	}
	out, err := enc.Step(ctx, []engine.StepInput{{Seq: 2, Tokens: in, Sample: true}})
	if err != nil {
		t.Fatal(err)
	}
	if d := maxAbs(out[0].Embedding, widen(want)); d > 1e-6 {
		t.Errorf("after the refusals the vector moved by %g", d)
	}
	// A pooled sequence takes nothing after the input that ended it.
	if _, err := enc.Step(ctx, []engine.StepInput{{Seq: 2, Tokens: in, Sample: true}}); !errors.As(err, &ip) {
		t.Errorf("a second input: %v, want an InvalidParamError", err)
	}
	enc.Free(2, "")

	// A decoder: pooled sequences never reuse or leave KV for the prefix
	// cache, and a model without embed_dim refuses OpenPooled.
	dec := load(t, e, tiny(t))
	defer dec.Close()
	whole := dec.FreeBlocks()
	if whole == 0 {
		t.Fatal("the decoder does not page")
	}
	long := prompt(5, 40)
	base := embedOne(t, dec, 1, long, engine.PoolLast)
	if r, err := dec.Open(ctx, 2, long, ""); err != nil || r != 0 {
		t.Errorf("after a pooled sequence freed: reused %d (%v), want 0", r, err)
	}
	if _, err := dec.Step(ctx, []engine.StepInput{{Seq: 2, Tokens: long, Sample: true, Params: greedy}}); err != nil {
		t.Fatal(err)
	}
	dec.Free(2, "key") // saved, and its full blocks cached
	if d := maxAbs(embedOne(t, dec, 3, long, engine.PoolLast), widen(base)); d > 1e-6 {
		t.Errorf("with the prompt's KV cached and saved the vector moved by %g", d)
	}
	// Every block a pooled sequence took is back once it is freed (the
	// saved prefix's count as free).
	deadline := time.Now().Add(5 * time.Second)
	for dec.FreeBlocks() != whole && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := dec.FreeBlocks(); got != whole {
		t.Errorf("%d blocks free after the sequences were freed, %d before", got, whole)
	}
	dec.info.EmbedDim = 0
	if err := dec.OpenPooled(ctx, 4, long, engine.PoolLast); !errors.As(err, &ip) {
		t.Errorf("a model that does not embed: %v, want an InvalidParamError", err)
	}
}

func widen(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

//go:build mlx

package mlx

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestEncoderConfigRefused loads encoder checkpoints whose config.json
// the forward pass cannot run as transformers does, or whose tensors
// contradict it: each is a *engine.CheckpointError, before any weight is
// read.
func TestEncoderConfigRefused(t *testing.T) {
	e := newEngine(t)
	cases := []struct {
		arch string
		set  map[string]any
	}{
		{"bert", map[string]any{"hidden_act": "relu"}},
		{"bert", map[string]any{"position_embedding_type": "relative_key"}},
		{"bert", map[string]any{"is_decoder": true}},
		{"bert", map[string]any{"add_cross_attention": true}},
		{"bert", map[string]any{"type_vocab_size": 0}},
		{"bert", map[string]any{"layer_norm_eps": -1}},
		{"bert", map[string]any{"num_attention_heads": 5}},
		{"bert", map[string]any{"num_hidden_layers": 1 << 20}},
		{"bert", map[string]any{"hidden_size": 0}},
		{"bert", map[string]any{"max_position_embeddings": 1024}}, // past the position table
		{"bert", map[string]any{"type_vocab_size": 3}},            // contradicts the token type table
		{"bert", map[string]any{"vocab_size": 100}},
		{"bert", map[string]any{"quantization": map[string]any{"group_size": 64, "bits": 4}}},
		{"modernbert", map[string]any{"hidden_activation": "silu"}},
		{"modernbert", map[string]any{"local_attention": 0}},
		{"modernbert", map[string]any{"global_attn_every_n_layers": 0}},
		{"modernbert", map[string]any{"layer_types": []string{"full_attention"}}},
		{"modernbert", map[string]any{"layer_types": []string{"full_attention", "causal", "full_attention"}}},
		{"modernbert", map[string]any{"rope_scaling": map[string]any{"rope_type": "linear", "factor": 2}}},
		{"modernbert", map[string]any{"global_rope_theta": -5}},
		{"modernbert", map[string]any{"local_rope_theta": "x"}},
		{"modernbert", map[string]any{"norm_eps": 0}},
		{"modernbert", map[string]any{"norm_bias": true}}, // the biases are not there
		{"modernbert", map[string]any{"intermediate_size": 100}},
	}
	for i, tc := range cases {
		t.Run(fmt.Sprintf("%d-%s", i, tc.arch), func(t *testing.T) {
			dir := t.TempDir()
			if err := testmodel.Write(dir, testmodel.TinyFamily(tc.arch)); err != nil {
				t.Fatal(err)
			}
			editConfig(t, dir, func(m map[string]any) {
				for k, v := range tc.set {
					m[k] = v
				}
			})
			m, err := e.Load(context.Background(), engine.ModelSpec{ID: "bad", Path: dir})
			if err == nil {
				m.Close()
				t.Fatalf("%v: loaded", tc.set)
			}
			if !isCheckpoint(err) {
				t.Fatalf("%v: %v (%T), want *engine.CheckpointError", tc.set, err, err)
			}
			t.Logf("%v: %v", tc.set, err)
		})
	}
}

// TestEmbedMatchesTorch compares pooled vectors with the Python engine's
// torch backend on the same float32 checkpoints (both encoders, qwen3
// and llama), within 1e-4, and checks that both report the same Info
// for embeddings. It skips while the torch engine does not embed: its
// model of the tiny llama does not implement engine.Embedder or reports
// EmbedDim 0.
func TestEmbedMatchesTorch(t *testing.T) {
	py := torchEngine(t)
	e := newEngine(t)
	ctx := context.Background()
	probe, err := py.Load(ctx, engine.ModelSpec{ID: "probe", Path: tinyDir(t, nil)})
	if err != nil {
		t.Fatal(err)
	}
	_, embeds := probe.(engine.Embedder)
	embeds = embeds && probe.Info().EmbedDim > 0
	probe.Close()
	if !embeds {
		t.Skip("the torch engine does not embed yet")
	}
	for _, arch := range []string{"bert", "modernbert", "qwen3", "llama"} {
		t.Run(arch, func(t *testing.T) {
			cfg := testmodel.TinyFamily(arch)
			cfg.Embedding = &testmodel.Embedding{Pooling: "mean", Normalize: true, MaxSeqLength: 100}
			dir := t.TempDir()
			if err := testmodel.Write(dir, cfg); err != nil {
				t.Fatal(err)
			}
			ref, err := py.Load(ctx, engine.ModelSpec{ID: arch, Path: dir})
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			mine, err := e.Load(ctx, engine.ModelSpec{ID: arch, Path: dir})
			if err != nil {
				t.Fatal(err)
			}
			defer mine.Close()
			ri, mi := ref.Info(), mine.Info()
			if ri.EmbedDim != mi.EmbedDim || ri.Pooling != mi.Pooling || ri.Normalize != mi.Normalize || ri.Encoder != mi.Encoder ||
				ri.ContextLength != mi.ContextLength {
				t.Errorf("Info: torch dim %d pooling %v normalize %v encoder %v context %d; mlx %d %v %v %v %d",
					ri.EmbedDim, ri.Pooling, ri.Normalize, ri.Encoder, ri.ContextLength, mi.EmbedDim, mi.Pooling, mi.Normalize, mi.Encoder, mi.ContextLength)
			}
			var worst float64
			for _, pool := range pools {
				for i, in := range embedInputs() {
					want := embedOne(t, ref, engine.SeqID(i), in, pool, len(in))
					got := embedOne(t, mine, engine.SeqID(i), in, pool, len(in))
					d := maxAbs(got, want)
					worst = math.Max(worst, d)
					if d > 1e-4 {
						t.Errorf("%v input %d: max |difference| from torch %.3g", pool, i, d)
					}
				}
			}
			t.Logf("max |difference| from torch %.2e", worst)
		})
	}
}

package mlxserving_test

import (
	"context"
	"math"
	"os"
	"testing"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/tokenizer"
	"github.com/mlxserving/mlxserving/internal/reference"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestEmbedTextsOnTorch: checkpoints as published — a BERT encoder with
// its WordPiece tokenizer and sentence-transformers files (CLS pooling,
// normalized), and a Qwen3 decoder with last-token pooling — served by
// the Server on the Python engine (CPU): texts in, each vector equal to
// the float64 reference's over the tokenizer's ids, normalized, whether
// its input ran alone or among others.
func TestEmbedTextsOnTorch(t *testing.T) {
	testEmbedTexts(t, pythonEngine(t, 1))
}

// testEmbedTexts is TestEmbedTextsOnTorch on engine e.
func testEmbedTexts(t *testing.T, e engine.Engine) {
	py := os.Getenv("MLXSERVING_PYTHON")
	if py == "" {
		t.Skip("MLXSERVING_PYTHON is not set: the reference needs torch (scripts/setup.d/30-python.sh)")
	}
	srv, err := mlxserving.New(e)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	texts := []string{"Paging keeps the KV cache in blocks.", "hello world", "A third, longer text about embeddings and retrieval!"}
	for _, tc := range []struct {
		arch string
		emb  testmodel.Embedding
		pool engine.Pooling
	}{
		{"bert", testmodel.Embedding{Pooling: "cls", Normalize: true}, engine.PoolCLS},
		{"qwen3", testmodel.Embedding{Pooling: "lasttoken", Normalize: true}, engine.PoolLast},
	} {
		t.Run(tc.arch, func(t *testing.T) {
			dir := t.TempDir()
			cfg := testmodel.TinyFamily(tc.arch)
			cfg.Embedding = &tc.emb
			if err := testmodel.Write(dir, cfg); err != nil {
				t.Fatal(err)
			}
			if err := srv.LoadModel(ctx, engine.ModelSpec{ID: tc.arch, Path: dir}); err != nil {
				t.Fatal(err)
			}
			defer srv.UnloadModel(ctx, tc.arch)
			tok, err := tokenizer.Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			var inputs []api.EmbedInput
			var ids [][]int32
			for _, s := range texts {
				inputs = append(inputs, api.EmbedInput{Text: s})
				toks, err := tok.Encode(s, true)
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, toks)
			}
			res, err := srv.Embed(ctx, api.EmbedRequest{Model: tc.arch, Inputs: inputs})
			if err != nil {
				t.Fatal(err)
			}
			want, err := reference.Embed(ctx, py, dir, ids, tc.pool)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range res.Vectors {
				var n float64
				for _, x := range want[i] {
					n += x * x
				}
				n = math.Sqrt(n)
				for j := range v {
					if d := math.Abs(float64(v[j]) - want[i][j]/n); d > 1e-4 {
						t.Fatalf("text %d value %d: %v, reference %v", i, j, v[j], want[i][j]/n)
					}
				}
			}
			alone, err := srv.Embed(ctx, api.EmbedRequest{Model: tc.arch, Inputs: inputs[1:2]})
			if err != nil {
				t.Fatal(err)
			}
			for j := range alone.Vectors[0] {
				if d := math.Abs(float64(alone.Vectors[0][j] - res.Vectors[1][j])); d > 1e-5 {
					t.Fatalf("text 1 alone and among others differ at %d by %v", j, d)
				}
			}
		})
	}
}

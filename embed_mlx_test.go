//go:build mlx

package mlxserving_test

import (
	"testing"

	"github.com/mlxserving/mlxserving/engine/mlx"
)

// TestMLXEmbedTexts is TestEmbedTextsOnTorch on the MLX engine: a BERT
// checkpoint with its WordPiece tokenizer and a Qwen3 embedder, texts in
// through the Server, vectors equal to the float64 reference's.
func TestMLXEmbedTexts(t *testing.T) {
	e, err := mlx.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	testEmbedTexts(t, e)
}

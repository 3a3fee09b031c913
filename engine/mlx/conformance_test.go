//go:build mlx

package mlx

import (
	"testing"

	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestConformance runs the engine conformance suite on the tiny float32
// checkpoint and on its 8-bit quantized form.
func TestConformance(t *testing.T) {
	e := newEngine(t)
	dir := tinyDir(t, nil)
	t.Run("float32", func(t *testing.T) { enginetest.Run(t, e, dir) })
	t.Run("q8", func(t *testing.T) {
		q := t.TempDir()
		if err := e.Quantize(t.Context(), dir, q, 8, 64); err != nil {
			t.Fatal(err)
		}
		enginetest.Run(t, e, q)
	})
}

// TestEmbeddingConformance runs enginetest.RunEmbedding on both encoders
// and on decoders of three families.
func TestEmbeddingConformance(t *testing.T) {
	e := newEngine(t)
	for _, arch := range []string{"bert", "modernbert", "qwen3", "llama", "gemma3"} {
		t.Run(arch, func(t *testing.T) {
			dir := t.TempDir()
			if err := testmodel.Write(dir, testmodel.TinyFamily(arch)); err != nil {
				t.Fatal(err)
			}
			enginetest.RunEmbedding(t, e, dir)
		})
	}
}

// TestAdapterConformance runs enginetest.RunAdapters on the tiny llama
// and qwen2 (biases) checkpoints: tokens equal the merged checkpoints'.
func TestAdapterConformance(t *testing.T) {
	e := newEngine(t)
	for _, arch := range []string{"llama", "qwen2"} {
		t.Run(arch, func(t *testing.T) {
			dir, cases, bad := enginetest.WriteAdapterFixture(t, testmodel.TinyFamily(arch))
			enginetest.RunAdapters(t, e, dir, cases, bad)
		})
	}
}

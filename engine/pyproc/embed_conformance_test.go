package pyproc

import (
	"testing"

	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestEmbeddingConformance runs enginetest.RunEmbedding on both encoders
// and on decoders of three families, over two workers.
func TestEmbeddingConformance(t *testing.T) {
	e := newEngine(t, WithWorkers(2))
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

package pyproc

import (
	"testing"

	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestYarnServedContext: a yarn checkpoint serves its original length
// times the factor where that exceeds max_position_embeddings (Qwen's
// setting: 32,768 x 4 over a config that says 40,960), as vLLM derives
// it, and a prompt that long is accepted; max_position_embeddings stays
// the floor.
func TestYarnServedContext(t *testing.T) {
	python(t)
	cfg := enginetest.YarnConfigs()["qwen3-yarn"] // factor 4 over 32 original positions
	e := newEngine(t)
	for _, c := range []struct {
		maxPos, want int
	}{{64, 128}, {256, 256}} {
		dir := t.TempDir()
		if err := testmodel.Write(dir, cfg); err != nil {
			t.Fatal(err)
		}
		editConfig(t, dir, "max_position_embeddings", c.maxPos)
		m := load(t, e, dir)
		if got := m.Info().ContextLength; got != c.want {
			t.Errorf("max_position_embeddings %d: served context %d, want %d", c.maxPos, got, c.want)
		}
		if got := generate(t, m, 1, prompt(1, c.want-1), 1); len(got) != 1 {
			t.Errorf("max_position_embeddings %d: a %d-token prompt generated %v", c.maxPos, c.want-1, got)
		}
		m.Close()
	}
}

package pyproc

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// TestHostileFamilyConfigs: every edit of enginetest.HostileConfigs is
// refused as a CheckpointError and the worker goes on serving.
func TestHostileFamilyConfigs(t *testing.T) {
	e := newEngine(t)
	for _, h := range enginetest.HostileConfigs() {
		dir := t.TempDir()
		if err := h.Write(dir); err != nil {
			t.Fatal(err)
		}
		m, err := e.Load(context.Background(), engine.ModelSpec{ID: "bad", Path: dir})
		if !errors.Is(err, engine.ErrBadCheckpoint) || !strings.Contains(err.Error(), h.Names) {
			t.Errorf("%s (%s): %v, want a CheckpointError naming %q", h.Name, h.Arch, err, h.Names)
			if m != nil {
				m.Close()
			}
		}
	}
	m := load(t, e, tiny(t))
	generate(t, m, 1, prompt(1, 5), 3)
}

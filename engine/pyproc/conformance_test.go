package pyproc

import (
	"testing"

	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// TestConformance runs the shared engine conformance suite against a real
// worker process and the tiny checkpoint.
func TestConformance(t *testing.T) {
	e := newEngine(t, WithWorkers(2))
	enginetest.Run(t, e, tiny(t))
}

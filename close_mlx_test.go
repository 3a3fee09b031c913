//go:build mlx

package mlxserving_test

import (
	"testing"

	"github.com/mlxserving/mlxserving/engine/mlx"
)

// TestMLXCloseWithinMaxTokens is TestPyprocCloseWithinMaxTokens on the MLX
// engine: the same schemas and budgets, every reply parses and validates.
func TestMLXCloseWithinMaxTokens(t *testing.T) {
	e, err := mlx.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	testCloseWithinMaxTokens(t, e)
}

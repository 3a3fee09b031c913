package toolcall

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tokenizersDir is the node_modules directory of the real tokenizers the
// test set-up installs; the test skips without it (fails under CI).
func tokenizersDir(t *testing.T) string {
	t.Helper()
	root := os.Getenv("MLXSERVING_TOKENIZERS")
	if root == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("MLXSERVING_TOKENIZERS is not set: source scripts/setup.d/20-tokenizers.sh")
		}
		t.Skip("MLXSERVING_TOKENIZERS is not set: source scripts/setup.d/20-tokenizers.sh")
	}
	return root
}

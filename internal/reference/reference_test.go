package reference

import (
	"context"
	"os"
	"testing"

	"github.com/mlxserving/mlxserving/testmodel"
)

// TestGreedy runs the reference on every family's tiny checkpoint: a run
// per prompt, n tokens each, log-probabilities at most 0 and gaps at
// least 0.
func TestGreedy(t *testing.T) {
	py := os.Getenv("MLXSERVING_PYTHON")
	if py == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("MLXSERVING_PYTHON is not set: source scripts/setup.d/30-python.sh")
		}
		t.Skip("MLXSERVING_PYTHON is not set (scripts/setup.d/30-python.sh installs python3-torch)")
	}
	for _, arch := range testmodel.Archs() {
		dir := t.TempDir()
		if err := testmodel.Write(dir, testmodel.TinyFamily(arch)); err != nil {
			t.Fatal(err)
		}
		runs, err := Greedy(context.Background(), py, dir, [][]int32{{1, 2, 3}, {7}}, 3)
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		for _, r := range runs {
			if len(r.Tokens) != 3 || len(r.Logprobs) != 3 || len(r.Gaps) != 3 {
				t.Fatalf("%s: run %+v", arch, r)
			}
			for i := range r.Tokens {
				if r.Logprobs[i] > 0 || r.Gaps[i] < 0 || r.Tokens[i] < 0 {
					t.Errorf("%s: step %d: token %d, logprob %v, gap %v", arch, i, r.Tokens[i], r.Logprobs[i], r.Gaps[i])
				}
			}
		}
	}
	if _, err := Greedy(context.Background(), py, t.TempDir(), [][]int32{{1}}, 1); err == nil {
		t.Error("a directory without a checkpoint: no error")
	}
}

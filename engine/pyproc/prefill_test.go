package pyproc

import (
	"testing"

	"github.com/mlxserving/mlxserving/testmodel"
)

// TestPrefillGraphsEmulated runs testdata/prefill_graphs_test.py: the
// prompt-step graphs' capture, buffers, buckets and padding on the CPU
// (each captured piece run again at every replay, the CUDA kernels stood
// in by plain torch) against the eager path: the same tokens and
// logprobs, and the same KV outside the scratch block.
func TestPrefillGraphsEmulated(t *testing.T) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	runPyCheck(t, "testdata/prefill_graphs_test.py", "runtime", dir)
}

// TestOverlapEmulated runs testdata/overlap_test.py: the speculated next
// decode step (after chains, ordinary and mixed steps; used whole, beside
// prompt chunks, or discarded) on the CPU, the decode graphs replayed as
// callables and the CUDA kernels stood in by plain torch, against the
// same scenario with the overlap off.
func TestOverlapEmulated(t *testing.T) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	runPyCheck(t, "testdata/overlap_test.py", "runtime", dir)
}

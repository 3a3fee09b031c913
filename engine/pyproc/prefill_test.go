package pyproc

import (
	"path/filepath"
	"testing"

	"github.com/mlxserving/mlxserving/testmodel"
)

// TestPrefillGraphsEmulated runs testdata/prefill_graphs_test.py: the
// prompt-step graphs' capture, buffers, buckets and padding on the CPU
// (each captured piece run again at every replay, the CUDA kernels stood
// in by plain torch) against the eager path: the same tokens and
// logprobs, and the same KV outside the scratch block, for each dense
// family, with the graphs piecewise around attention and of whole steps
// around the paged prompt attention (captured again when the KV table is
// reallocated).
func TestPrefillGraphsEmulated(t *testing.T) {
	args := []string{"runtime"}
	// Llama, biases, QK norm, Gemma 3's sandwich norms, scale and sliding
	// layers, Mistral's window, Phi-3's fused projections, partial rotary
	// and longrope, OLMo 2's norms after; mixtures of experts on the fused
	// experts' path (its kernels stood in by plain torch).
	for _, arch := range []string{"llama", "qwen2", "qwen3", "gemma3_text", "mistral", "phi3", "olmo2", "qwen3_moe", "mixtral"} {
		dir := filepath.Join(t.TempDir(), arch)
		if err := testmodel.Write(dir, testmodel.TinyFamily(arch)); err != nil {
			t.Fatal(err)
		}
		args = append(args, dir)
	}
	runPyCheck(t, "testdata/prefill_graphs_test.py", args...)
}

// TestOverlapEmulated runs testdata/overlap_test.py: the speculated next
// decode step (after chains, ordinary and mixed steps; used whole, beside
// prompt chunks, or discarded) on the CPU, the decode graphs replayed as
// callables and the CUDA kernels stood in by plain torch, against the
// same scenario with the overlap off, on a model with sliding layers too.
func TestOverlapEmulated(t *testing.T) {
	args := []string{"runtime"}
	// gemma3: sliding layers give blocks back, QK norms inside the decode
	// attention; qwen3_moe: its k choices summed inside the next norm.
	for _, arch := range []string{"llama", "gemma3_text", "qwen3_moe"} {
		dir := filepath.Join(t.TempDir(), arch)
		if err := testmodel.Write(dir, testmodel.TinyFamily(arch)); err != nil {
			t.Fatal(err)
		}
		args = append(args, dir)
	}
	runPyCheck(t, "testdata/overlap_test.py", args...)
}

// TestWorkerHostStepBench runs BenchmarkWorkerHostStep's script on a
// small batch, greedy and sampled: decode steps run on the emulated
// device chain with the next one speculated behind it, mixed steps the
// speculated decodes beside a prompt chunk (the script asserts it), so
// the benchmark measures the paths it names; and its lone prompt's steps
// (the script asserts each step returns a token).
func TestWorkerHostStepBench(t *testing.T) {
	py, dir := python(t), tiny(t)
	for _, mix := range []string{"decode", "mixed"} {
		for _, params := range []string{"greedy", "sampled"} {
			if ms, perRow := hostStep(t, py, dir, 12, 20, params, mix); ms <= 0 || perRow <= 0 {
				t.Errorf("%s %s: host time a step %v ms, %v µs a row", mix, params, ms, perRow)
			}
		}
	}
	if ms, perToken := hostStep(t, py, dir, 300, 5, "greedy", "prompt"); ms <= 0 || perToken <= 0 {
		t.Errorf("prompt: host time a step %v ms, %v µs a token", ms, perToken)
	}
}

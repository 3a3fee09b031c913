package pyproc

import (
	"testing"

	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestConformance runs the shared engine conformance suite against a real
// worker process and the tiny checkpoint.
func TestConformance(t *testing.T) {
	e := newEngine(t, WithWorkers(2))
	enginetest.Run(t, e, tiny(t))
}

// TestPipelineConformance runs enginetest.RunPipeline against two real
// workers (each step request names the one before it on its own worker).
// Lookahead off: StepAsync leaves the small batches it would serve to
// Step. The prefix cache off: the suite's pipelined run opens the
// synchronous run's prompts again without a key and wants nothing
// reused, which the cache would reuse.
func TestPipelineConformance(t *testing.T) {
	e := newEngine(t, WithWorkers(2), WithLookahead(1), WithTuning(Tuning{NoPrefixCache: true}))
	enginetest.RunPipeline(t, e, tiny(t))
}

// TestAdapterConformance runs enginetest.RunAdapters on the tiny llama,
// qwen2 (biases) and phi3 (fused projections) checkpoints: tokens equal
// the merged checkpoints'. One worker: the suite's one-slot model must
// refuse a second adapter, and each worker has Info().AdapterSlots slots
// of its own (TestAdapterWorkersAndLookahead covers two).
func TestAdapterConformance(t *testing.T) {
	e := newEngine(t)
	for _, arch := range []string{"llama", "qwen2", "phi3"} {
		t.Run(arch, func(t *testing.T) {
			dir, cases, bad := enginetest.WriteAdapterFixture(t, testmodel.TinyFamily(arch))
			enginetest.RunAdapters(t, e, dir, cases, bad)
		})
	}
}

// TestTensorParallelAdapterConformance runs enginetest.RunAdapters on a
// tensor-parallel-2 worker: adapters loaded at run time on every rank,
// evicted and reloaded in one slot, pinned, removed and refused, their
// tokens the merged checkpoints'.
func TestTensorParallelAdapterConformance(t *testing.T) {
	python(t)
	needGPUs(t, 2)
	e := newEngine(t, WithTensorParallel(2))
	for _, arch := range []string{"llama", "qwen2"} {
		t.Run(arch, func(t *testing.T) {
			dir, cases, bad := enginetest.WriteAdapterFixture(t, testmodel.TinyFamily(arch))
			enginetest.RunAdapters(t, e, dir, cases, bad)
		})
	}
}

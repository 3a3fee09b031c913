package pyproc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// kvCacheModels writes the checkpoints the FP8 KV tests serve: Llama, and
// Gemma 3 for its sliding layers (blocks given back as the window moves)
// and its own attention scale.
func kvCacheModels(t *testing.T, archs ...string) []string {
	t.Helper()
	var dirs []string
	for _, arch := range archs {
		dir := filepath.Join(t.TempDir(), arch)
		if err := testmodel.Write(dir, testmodel.TinyFamily(arch)); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dir)
	}
	return dirs
}

// TestKVCacheFP8 runs testdata/kvcache_test.py on the CPU: the e4m3 bytes
// the pool stores; greedy tokens and logprobs of a model with the FP8
// pool equal to those of a float32 pool whose every key and value is
// rounded through e4m3 with the checkpoint's scales (prompt chunks,
// decodes, a reused prefix; the torch path and the CUDA path's code with
// its kernels stood in); a pool sized from memory holding 4x float32's
// tokens and 2x bfloat16's; refusals of an unknown dtype and a bad scale.
func TestKVCacheFP8(t *testing.T) {
	args := append([]string{"runtime"}, kvCacheModels(t, "llama", "gemma3_text")...)
	runPyCheck(t, "testdata/kvcache_test.py", args...)
}

// TestKVCacheFP8CUDA (MLXSERVING_TEST_DEVICE=cuda only) runs
// testdata/kvcache_test.py --cuda: the Triton kernels' FP8 bytes against
// torch's float8_e4m3fn conversion and their decode attention against
// plain torch over the dequantized pool; then each family served on CUDA
// with the FP8 pool (kernels, decode graphs, varlen prompt attention,
// prompt-step graphs) against the CPU's emulated FP8 pool: tokens equal up
// to a near tie, logprobs within 0.15 in bfloat16 (Gemma 3's rounding)
// and 0.01 in float32; bfloat16 runs with and without the paged
// prompt-attention kernel.
func TestKVCacheFP8CUDA(t *testing.T) {
	if os.Getenv("MLXSERVING_TEST_DEVICE") != "cuda" {
		t.Skip("CUDA only (MLXSERVING_TEST_DEVICE=cuda)")
	}
	args := append([]string{"runtime", "--cuda"}, kvCacheModels(t, "llama", "gemma3_text", "mistral")...)
	runPyCheck(t, "testdata/kvcache_test.py", args...)
}

// TestKVCacheFP8Engine serves a model with WithKVCacheDtype("fp8") through
// the engine: the pool of the same capacity takes a quarter of float32's
// bytes (newEngine loads float32 on every device), so memory holds 4x the
// tokens (2x against a bfloat16 pool), and it generates.
func TestKVCacheFP8Engine(t *testing.T) {
	ctx := context.Background()
	spec := engine.ModelSpec{ID: "tiny", Path: tiny(t), KVCapacity: 1024}
	serve := func(opts ...Option) engine.Info {
		m, err := newEngine(t, opts...).Load(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if got := generate(t, m.(*Model), 1, prompt(1, 40), 6); len(got) != 6 {
			t.Fatalf("generated %v", got)
		}
		return m.Info()
	}
	plain, fp8 := serve(), serve(WithKVCacheDtype("fp8"))
	if fp8.KVCapacity != plain.KVCapacity || fp8.KVBytes*4 != plain.KVBytes {
		t.Errorf("FP8 pool: %d tokens in %d bytes; float32 pool: %d tokens in %d bytes; want the same tokens in 1/4 the bytes",
			fp8.KVCapacity, fp8.KVBytes, plain.KVCapacity, plain.KVBytes)
	}
}

// TestKVCacheDtypeRefused: an unknown KV cache dtype fails New with
// engine.ErrInvalidParam, and the worker refuses it at load the same way
// for a supervisor that sends it anyway.
func TestKVCacheDtypeRefused(t *testing.T) {
	ctx := context.Background()
	if _, err := New(ctx, WithKVCacheDtype("bogus")); !errors.Is(err, engine.ErrInvalidParam) {
		t.Errorf("WithKVCacheDtype(bogus): %v, want engine.ErrInvalidParam", err)
	}
	e := newEngine(t)
	e.cfg.kvCacheDtype = "bogus"
	m, err := e.Load(ctx, engine.ModelSpec{ID: "tiny", Path: tiny(t)})
	if !errors.Is(err, engine.ErrInvalidParam) || !strings.Contains(err.Error(), "kv_cache_dtype") {
		t.Errorf("load with kv_cache_dtype bogus: %v, want engine.ErrInvalidParam naming kv_cache_dtype", err)
	}
	if m != nil {
		m.Close()
	}
}

// TestKVCacheFP8TensorParallel: with the FP8 pool split over two ranks
// (each its KV heads' share, gloo on the CPU) the workload of
// TestTensorParallelMatches samples what one rank does.
func TestKVCacheFP8TensorParallel(t *testing.T) {
	python(t)
	needGPUs(t, 2)
	dirs := tpFamilies(t, 2)
	one := newEngine(t, WithKVCacheDtype("fp8"))
	two := newEngine(t, WithKVCacheDtype("fp8"), WithTensorParallel(2))
	for _, arch := range []string{"llama", "gemma3_text"} {
		want := tpScript(t, loadID(t, one, arch, dirs[arch]))
		if got := tpScript(t, loadID(t, two, arch, dirs[arch])); !slices.Equal(got, want) {
			t.Errorf("%s: FP8 KV over 2 ranks gave\n%v\nwant (one rank)\n%v", arch, got, want)
		}
	}
}

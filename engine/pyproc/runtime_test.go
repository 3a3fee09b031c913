package pyproc

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

func TestRuntimeInstalledPrivate(t *testing.T) {
	dir, err := installRuntime(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("runtime dir mode %v, %v; want 0700", fi.Mode().Perm(), err)
	}
	files := 0
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		want := fs.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		} else {
			files++
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The entry script and the package's modules, at every level.
	for _, f := range []string{"worker.py", "mlxsworker/__init__.py", "mlxsworker/protocol.py", "mlxsworker/torchrt/model.py",
		"mlxsworker/mlxlm/backend.py"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("installed runtime: %v", err)
		}
	}
	if want, _, _, _ := runtimeFiles(); files != len(want) {
		t.Errorf("installed %d files, want the %d embedded", files, len(want))
	}
	// A second install reuses and re-verifies the directory.
	if again, err := installRuntime(filepath.Dir(dir)); err != nil || again != dir {
		t.Fatalf("reinstall: %s, %v", again, err)
	}
}

// TestRuntimeTampered: every way another user (or anything else) could
// change what the worker runs makes the start fail with a RuntimeDirError
// naming the path, both at New and at a later worker start.
func TestRuntimeTampered(t *testing.T) {
	cases := []struct {
		name   string
		tamper func(t *testing.T, dir string)
		want   string
	}{
		{"edited file", func(t *testing.T, dir string) {
			appendTo(t, filepath.Join(dir, "worker.py"), "\nimport os; os.system('id')\n")
		}, "differs from this binary's"},
		{"edited module", func(t *testing.T, dir string) {
			appendTo(t, filepath.Join(dir, "mlxsworker", "torchrt", "sampling.py"), "\nimport os; os.system('id')\n")
		}, "differs from this binary's"},
		{"replaced by a link", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "mlxsworker", "torchrt", "st.py")
			os.Rename(p, p+".orig")
			os.Symlink(p+".orig", p)
		}, "not part of the runtime"},
		{"linked in place", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "mlxsworker", "torchrt", "st.py")
			other := filepath.Join(t.TempDir(), "st.py")
			os.Rename(p, other)
			os.Symlink(other, p)
		}, "is a symbolic link"},
		{"extra module shadowing torch", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "torch.py"), []byte("raise SystemExit"), 0o600)
		}, "not part of the runtime"},
		{"extra module in the package", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "mlxsworker", "torchrt", "extra.py"), []byte("raise SystemExit"), 0o600)
		}, "not part of the runtime"},
		{"extra directory", func(t *testing.T, dir string) { os.Mkdir(filepath.Join(dir, "mlxsworker", "torch"), 0o700) }, "not part of the runtime"},
		{"bytecode cache", func(t *testing.T, dir string) { os.Mkdir(filepath.Join(dir, "__pycache__"), 0o700) }, "not part of the runtime"},
		{"bytecode cache in the package", func(t *testing.T, dir string) {
			os.Mkdir(filepath.Join(dir, "mlxsworker", "torchrt", "__pycache__"), 0o700)
		}, "not part of the runtime"},
		{"group-writable file", func(t *testing.T, dir string) {
			os.Chmod(filepath.Join(dir, "mlxsworker", "torchrt", "decoder.py"), 0o620)
		}, "writable by other users"},
		{"opened directory", func(t *testing.T, dir string) { os.Chmod(dir, 0o755) }, "want 0700"},
		{"opened package", func(t *testing.T, dir string) { os.Chmod(filepath.Join(dir, "mlxsworker", "mlxlm"), 0o755) }, "want 0700"},
		{"package replaced by a link", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "mlxsworker", "mlxlm")
			other := filepath.Join(t.TempDir(), "mlxlm")
			os.Rename(p, other)
			os.Symlink(other, p)
		}, "is a symbolic link"},
		{"missing file", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "mlxsworker", "torchrt", "sampling.py")) }, "no such file"},
		{"foreign-owned directory", func(t *testing.T, dir string) {
			if os.Geteuid() != 0 {
				t.Skip("changing a file's owner needs root")
			}
			if err := os.Chown(dir, 4242, 4242); err != nil {
				t.Fatal(err)
			}
		}, "owned by uid 4242"},
		{"foreign-owned file", func(t *testing.T, dir string) {
			if os.Geteuid() != 0 {
				t.Skip("changing a file's owner needs root")
			}
			if err := os.Chown(filepath.Join(dir, "worker.py"), 4242, 4242); err != nil {
				t.Fatal(err)
			}
		}, "owned by uid 4242"},
		{"foreign-owned package", func(t *testing.T, dir string) {
			if os.Geteuid() != 0 {
				t.Skip("changing a file's owner needs root")
			}
			if err := os.Chown(filepath.Join(dir, "mlxsworker", "torchrt"), 4242, 4242); err != nil {
				t.Fatal(err)
			}
		}, "owned by uid 4242"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cache := t.TempDir()
			dir, err := installRuntime(cache)
			if err != nil {
				t.Fatal(err)
			}
			c.tamper(t, dir)
			var rde *RuntimeDirError
			_, err = New(context.Background(), WithPython("/nonexistent/python3"), WithCacheDir(cache))
			if !errors.As(err, &rde) || !errors.Is(err, ErrUnsafeRuntime) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New over a tampered runtime: %v; want a RuntimeDirError saying %q", err, c.want)
			}
			// A worker (re)start checks again, before running anything.
			cfg := defaults()
			if _, err := startProc(context.Background(), &cfg, dir, 0); !errors.Is(err, ErrUnsafeRuntime) {
				t.Fatalf("startProc over a tampered runtime: %v", err)
			}
		})
	}
}

func TestRuntimeCacheDirChecked(t *testing.T) {
	cache := t.TempDir()
	if err := os.Chmod(cache, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := installRuntime(cache); !errors.Is(err, ErrUnsafeRuntime) || !strings.Contains(err.Error(), "writable by other users") {
		t.Fatalf("world-writable cache dir: %v", err)
	}
	// The sticky bit (as on /tmp) keeps others from renaming our directory.
	if err := os.Chmod(cache, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if _, err := installRuntime(cache); err != nil {
		t.Fatalf("sticky cache dir: %v", err)
	}
}

func appendTo(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// TestRuntimeKernels runs testdata/kernels_test.py (MLXSERVING_TEST_DEVICE=cuda
// only): each Triton kernel of the CUDA decode path agrees with the plain
// torch code it replaces, for every family's shapes in every serving dtype.
// A worker only builds them at load (kernels.probe), so this is where
// their numbers are checked. One process a dtype, in parallel: building
// the kernels, not running them, takes the time (over 200 s for all three
// dtypes in one process on a fresh H200).
func TestRuntimeKernels(t *testing.T) {
	if os.Getenv("MLXSERVING_TEST_DEVICE") != "cuda" {
		t.Skip("CUDA only (MLXSERVING_TEST_DEVICE=cuda)")
	}
	for _, dtype := range []string{"bfloat16", "float16", "float32"} {
		t.Run(dtype, func(t *testing.T) {
			t.Parallel()
			runPyCheck(t, "testdata/kernels_test.py", "runtime", dtype)
		})
	}
}

// TestPromptAttentionCUDA runs testdata/prompt_attention_test.py
// (MLXSERVING_TEST_DEVICE=cuda only): the paged prompt-attention kernel of
// the whole-step prompt graphs against plain float32 attention over the
// same pool, for every family's shapes, chunks fresh and after a long
// prefix, windows, block sizes, FP8 pools; and its load check. Each case
// is a kernel build, so three processes take a third of the shapes each
// (77 s on an H200, where one took over four minutes).
func TestPromptAttentionCUDA(t *testing.T) {
	if os.Getenv("MLXSERVING_TEST_DEVICE") != "cuda" {
		t.Skip("CUDA only (MLXSERVING_TEST_DEVICE=cuda)")
	}
	const parts = 3
	for k := range parts {
		part := fmt.Sprintf("%d/%d", k, parts)
		t.Run(part, func(t *testing.T) {
			t.Parallel()
			runPyCheck(t, "testdata/prompt_attention_test.py", "runtime", "--part="+part)
		})
	}
}

// TestPDLCUDA runs testdata/pdl_test.py (MLXSERVING_TEST_DEVICE=cuda
// only, sm_90 or later): a chain of the decode path's kernels captured in
// a CUDA graph with programmatic dependent launch gives, replay after
// replay on fresh inputs, the same bits as without it, so no kernel reads
// its input before the kernel writing it has completed.
func TestPDLCUDA(t *testing.T) {
	if os.Getenv("MLXSERVING_TEST_DEVICE") != "cuda" {
		t.Skip("CUDA only (MLXSERVING_TEST_DEVICE=cuda)")
	}
	runPyCheck(t, "testdata/pdl_test.py", "runtime")
}

// TestBatchedDraws runs testdata/draws_test.py on the CPU: a step's
// temperature rows drawn at once (sampling.draws) filter each row as the
// row alone is filtered, never pick a token of probability 0, pick each
// token for its share of the uniforms, and draw a seeded row's token
// whatever else is in the batch.
func TestBatchedDraws(t *testing.T) {
	runPyCheck(t, "testdata/draws_test.py", "runtime")
}

// TestStepTiming runs testdata/timing_test.py on the CPU: the worker's
// step-cycle summary (time in the worker, waiting for the device, between
// a reply and the next step) from made-up times, logged once an interval.
func TestStepTiming(t *testing.T) {
	runPyCheck(t, "testdata/timing_test.py", "runtime")
}

// TestQuietGC runs testdata/gc_test.py on the CPU: the worker freezes
// its heap after a load, and an unload collects the unloaded model even
// where a reference cycle holds it, so its memory is free before another
// load.
func TestQuietGC(t *testing.T) {
	runPyCheck(t, "testdata/gc_test.py", "runtime", tiny(t))
}

// TestMoEAlign runs testdata/moe_align_test.py on the CPU: the fused
// expert kernels' block layout (moe.align) holds every (token, choice)
// pair once, in blocks of one expert, and the blocks run in plain torch
// as the kernels run them give the loop over experts' output.
func TestMoEAlign(t *testing.T) {
	runPyCheck(t, "testdata/moe_align_test.py", "runtime")
}

// TestMoEKernelsCUDA runs testdata/moe_kernels_cuda.py
// (MLXSERVING_TEST_DEVICE=cuda only): the fused expert kernels against
// the loop over experts in three families' shapes and three dtypes,
// eagerly and replayed from CUDA graphs.
func TestMoEKernelsCUDA(t *testing.T) {
	if os.Getenv("MLXSERVING_TEST_DEVICE") != "cuda" {
		t.Skip("CUDA only (MLXSERVING_TEST_DEVICE=cuda)")
	}
	runPyCheck(t, "testdata/moe_kernels_cuda.py", "runtime")
}

// TestTraceSummary runs testdata/trace_test.py on the CPU: the device
// trace's summary over a made-up trace with kernels (busy share, idle
// gaps, the phase of each), the recorder over a loop on the CPU profiler,
// and a directory it cannot write refused.
func TestTraceSummary(t *testing.T) {
	runPyCheck(t, "testdata/trace_test.py", "runtime")
}

// TestTraceReachesWorker: a worker told Tuning.TraceDir traces the steps
// it was told to (after TraceSkip, TraceSteps of them) and writes the
// trace and its summary there; one told a directory it cannot make fails
// to start, saying why.
func TestTraceReachesWorker(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "traces")
	e := newEngine(t, WithTuning(Tuning{TraceDir: dir, TraceSkip: 3, TraceSteps: 4}))
	m := load(t, e, tiny(t))
	generate(t, m, 1, []int32{1, 2, 3, 4, 5}, 12)
	var summary []byte
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		names, _ := filepath.Glob(filepath.Join(dir, "trace-*.txt"))
		if len(names) == 1 {
			var err error
			if summary, err = os.ReadFile(names[0]); err != nil {
				t.Fatal(err)
			}
			if len(summary) > 0 && summary[len(summary)-1] == '\n' {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no summary in %s: %v", dir, names)
		}
	}
	if !strings.Contains(string(summary), ".json.gz: 4 steps over") || !strings.Contains(string(summary), "no device events (a CPU worker)") {
		t.Errorf("summary:\n%s\nwant 4 steps on the CPU", summary)
	}
	traces, _ := filepath.Glob(filepath.Join(dir, "trace-*.json.gz"))
	if len(traces) != 1 {
		t.Fatalf("traces %v, want one", traces)
	}
	f, err := os.Open(traces[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(body), `"worker.step"`); n != 5 {
		t.Errorf("the trace holds %d worker.step events, want 5 (4 and the warm-up step)", n)
	}

	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bad, err := New(ctx, WithPython(python(t)), WithCacheDir(t.TempDir()), WithDevice("cpu"), WithThreads(1),
		WithTuning(Tuning{TraceDir: filepath.Join(file, "traces")}))
	if err == nil {
		_, err = bad.Load(ctx, engine.ModelSpec{ID: "tiny", Path: tiny(t)})
		_ = bad.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "trace_dir") {
		t.Fatalf("a trace directory under a file: %v, want an error naming trace_dir", err)
	}
	if !errors.Is(err, engine.ErrUnavailable) {
		t.Errorf("a trace directory under a file: %v, want engine.ErrUnavailable", err)
	}
	t.Logf("refused: %v", err)
}

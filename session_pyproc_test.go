package mlxserving_test

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/pyproc"
	"github.com/mlxserving/mlxserving/testmodel"
)

// pythonEngine starts the Python-subprocess engine with n workers, or
// skips without the interpreter scripts/setup.d/30-python.sh installs.
func pythonEngine(t testing.TB, n int) *pyproc.Engine {
	t.Helper()
	py := os.Getenv("MLXSERVING_PYTHON")
	if py == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("MLXSERVING_PYTHON is not set: source scripts/setup.d/30-python.sh")
		}
		t.Skip("MLXSERVING_PYTHON is not set (scripts/setup.d/30-python.sh installs python3-torch)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := pyproc.New(ctx, pyproc.WithPython(py), pyproc.WithCacheDir(t.TempDir()), pyproc.WithDevice("cpu"),
		pyproc.WithWorkers(n), pyproc.WithThreads(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// TestDeadWorkerLosesSessionKV: a session whose worker died loses its
// saved KV; the registry forgets it, and the next turn prefills fully and
// succeeds with the tokens a fresh prefill gives.
func TestDeadWorkerLosesSessionKV(t *testing.T) {
	e := pythonEngine(t, 1)
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	srv, err := mlxserving.New(e)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	if err := srv.LoadModel(ctx, engine.ModelSpec{ID: "tiny", Path: dir}); err != nil {
		t.Fatal(err)
	}
	turn := func(prompt []int32) api.Result {
		r := api.Request{Model: "tiny", PromptTokens: prompt, Params: api.Params{MaxTokens: 4, IgnoreEOS: true, Session: "conv"}}
		res, _ := run(t, srv, r)
		return res
	}
	first := seq(11, 40)
	res1 := turn(first)
	if sess, ok := srv.Session("conv"); !ok || sess.Worker != 0 || sess.Model != "tiny" {
		t.Fatalf("session %+v, %v; want it on worker 0 of model tiny", sess, ok)
	}
	second := append(append(append([]int32(nil), first...), res1.Tokens...), 5, 6, 7)
	pid := e.Workers()[0].PID
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The next turn waits for the replacement worker itself.
	waitFor(t, "the worker's death to be seen", func() bool { return e.Workers()[0].PID != pid })
	res2 := turn(second)
	if res2.Usage.CachedTokens != 0 {
		t.Fatalf("the turn after the worker died reused %d tokens", res2.Usage.CachedTokens)
	}
	if st := srv.SessionStats(); st.Forgotten != 1 {
		t.Fatalf("session stats %+v; want the session forgotten once", st)
	}
	want, _ := run(t, srv, api.Request{Model: "tiny", PromptTokens: second, Params: api.Params{MaxTokens: 4, IgnoreEOS: true}})
	if len(res2.Tokens) != 4 || want.Usage.CachedTokens != len(second)-1 {
		t.Fatalf("second turn %v; the same prompt again reused %d of %d", res2.Tokens, want.Usage.CachedTokens, len(second))
	}
	for i := range want.Tokens {
		if want.Tokens[i] != res2.Tokens[i] {
			t.Fatalf("second turn %v, with its own KV reused %v", res2.Tokens, want.Tokens)
		}
	}
	// The session goes on on the new worker.
	res3 := turn(append(append(append([]int32(nil), second...), res2.Tokens...), 9))
	if res3.Usage.CachedTokens < len(second) {
		t.Fatalf("third turn reused %d tokens, want at least %d", res3.Usage.CachedTokens, len(second))
	}
}

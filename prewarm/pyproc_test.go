package prewarm_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/pyproc"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/testmodel"
)

// pyprocServer is a Server over the Python engine's torch backend on CPU
// (scripts/setup.d/30-python.sh installs it; the tests skip without it
// unless CI is set).
func pyprocServer(t *testing.T, workers int) (*pyproc.Engine, *mlxserving.Server) {
	t.Helper()
	py := os.Getenv("MLXSERVING_PYTHON")
	if py == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("MLXSERVING_PYTHON is not set: source scripts/setup.d/30-python.sh")
		}
		t.Skip("MLXSERVING_PYTHON is not set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eng, err := pyproc.New(ctx, pyproc.WithPython(py), pyproc.WithCacheDir(t.TempDir()), pyproc.WithDevice("cpu"),
		pyproc.WithThreads(1), pyproc.WithWorkers(workers))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := mlxserving.New(eng)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Close()
		_ = eng.Close()
	})
	return eng, srv
}

func tinyCheckpoint(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestPyprocBadCheckpointReportsWhileOthersServe(t *testing.T) {
	_, srv := pyprocServer(t, 1)
	good := tinyCheckpoint(t)
	bad := tinyCheckpoint(t)
	if err := os.WriteFile(filepath.Join(bad, "model.safetensors"), []byte("not a safetensors file"), 0o644); err != nil {
		t.Fatal(err)
	}
	models := []prewarm.Model{
		{Spec: engine.ModelSpec{ID: "good", Path: good}, Priority: 1, Prompts: []string{"Hello"}},
		{Spec: engine.ModelSpec{ID: "bad", Path: bad}, Priority: 2},
	}
	pw, err := prewarm.New(srv, models, prewarm.WithConcurrency(2), prewarm.WithReadiness(prewarm.WhileWarming(1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := pw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer pw.Stop()
	if err := pw.Ready(context.Background()); !errors.Is(err, prewarm.ErrNotReady) || !errors.Is(err, engine.ErrBadCheckpoint) {
		t.Fatalf("Ready with a bad checkpoint at priority 2: %v", err)
	}
	_ = pw.Wait(context.Background())
	st := pw.Status()
	if m := st.Models[0]; m.ID != "bad" || m.Phase != prewarm.Failed || !errors.Is(m.Err, engine.ErrBadCheckpoint) {
		t.Fatalf("bad model: %+v", m)
	}
	if m := st.Models[1]; m.ID != "good" || m.Phase != prewarm.Ready || m.Warm.Generations != 1 || len(m.Warm.BatchSizes) == 0 {
		t.Fatalf("good model: %+v", m)
	}
	// The manager keeps the cause; the good model serves.
	if s := status(srv, "bad"); s.State != prewarm.StateFailed || !errors.Is(s.Err, engine.ErrBadCheckpoint) {
		t.Fatalf("bad model's status: %+v", s)
	}
	mustGenerate(t, srv, "good")
	_, err = generate(context.Background(), srv, "bad", 2)
	var le *prewarm.LoadError
	if !errors.As(err, &le) || !errors.Is(err, engine.ErrBadCheckpoint) {
		t.Fatalf("request for the bad model: %v, want its *LoadError", err)
	}
}

func TestPyprocShutdownDuringLoadLeavesNoWorker(t *testing.T) {
	eng, srv := pyprocServer(t, 2)
	var pids []int
	for _, w := range eng.Workers() {
		pids = append(pids, w.PID)
	}
	dir := tinyCheckpoint(t)
	loading := make(chan struct{}, 1)
	pw, err := prewarm.New(srv, []prewarm.Model{{Spec: engine.ModelSpec{ID: "tiny", Path: dir}}},
		prewarm.WithOnChange(func(p prewarm.ModelProgress) {
			if p.Phase == prewarm.Loading {
				loading <- struct{}{}
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := pw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-loading
	// Shut the server down while the model loads: the load is cancelled
	// and nothing of it stays loaded.
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	pw.Stop()
	if m := pw.Status().Models[0]; m.Phase == prewarm.Ready {
		t.Fatalf("model became ready after shutdown: %+v", m)
	}
	if n := len(srv.Models()); n != 0 {
		t.Fatalf("%d models loaded after shutdown", n)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("worker %d still exists after shutdown (kill 0: %v)", pid, err)
		}
	}
}

// TestPyprocWorkerLostDuringWarmUp kills the worker as warming starts: the
// engine restarts it and reloads the model, the warm-up is retried, and the
// model ends ready with its attempts in status.
func TestPyprocWorkerLostDuringWarmUp(t *testing.T) {
	eng, srv := pyprocServer(t, 1)
	dir := tinyCheckpoint(t)
	pid := eng.Workers()[0].PID
	pw, err := prewarm.New(srv, []prewarm.Model{{Spec: engine.ModelSpec{ID: "tiny", Path: dir}}},
		prewarm.WithOnChange(func(p prewarm.ModelProgress) {
			if p.Phase == prewarm.Warming {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := pw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer pw.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := pw.Ready(ctx); err != nil {
		t.Fatalf("Ready after a lost worker: %v", err)
	}
	m := pw.Status().Models[0]
	if m.Phase != prewarm.Ready || m.Attempts < 1 || m.Warm.Generations != 1 {
		t.Fatalf("status %+v", m)
	}
	if w := eng.Workers()[0]; w.Restarts != 1 || w.PID == pid {
		t.Fatalf("worker %+v, want one restart", w)
	}
	t.Logf("warm-up attempts: %d", m.Attempts)
	mustGenerate(t, srv, "tiny")
}

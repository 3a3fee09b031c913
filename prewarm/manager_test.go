package prewarm_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
)

func TestConcurrentFirstRequestsLoadOnce(t *testing.T) {
	sim, srv := simServer(t, []enginetest.SimOption{enginetest.WithLoadTime(50 * time.Millisecond)})
	register(t, srv, simModel("m"))
	if st := status(srv, "m"); st.State != prewarm.StateUnloaded {
		t.Fatalf("registered model is %v, want unloaded", st.State)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res, err := generate(context.Background(), srv, "m", 4); err != nil || len(res.Tokens) != 4 {
				errs <- errors.Join(err, errors.New("short result"))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := sim.Stats().Loads; n != 1 {
		t.Fatalf("64 concurrent first requests caused %d loads, want 1", n)
	}
	if st := status(srv, "m"); st.State != prewarm.StateLoaded || st.Loads != 1 {
		t.Fatalf("status %+v, want loaded once", st)
	}
}

func TestFailedLoadSharesErrorAndBacksOff(t *testing.T) {
	sim, srv := simServer(t, []enginetest.SimOption{enginetest.WithLoadTime(20 * time.Millisecond)},
		mlxserving.WithManagerOptions(prewarm.WithLoadBackoff(retry.MustPolicy(retry.WithBackoff(150*time.Millisecond, 300*time.Millisecond, 2)))))
	// A negative max batch makes the engine refuse the load.
	register(t, srv, prewarm.Model{Spec: engine.ModelSpec{ID: "bad", MaxBatch: -1}}, simModel("good"))
	var wg sync.WaitGroup
	got := make([]error, 16)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, got[i] = generate(context.Background(), srv, "bad", 2)
		}()
	}
	wg.Wait()
	var first *prewarm.LoadError
	if !errors.As(got[0], &first) || !errors.Is(got[0], engine.ErrInvalidParam) || !errors.Is(got[0], prewarm.ErrLoadFailed) {
		t.Fatalf("waiter got %v, want a *LoadError wrapping the engine's error", got[0])
	}
	for i, err := range got {
		var le *prewarm.LoadError
		if !errors.As(err, &le) || le != first {
			t.Fatalf("waiter %d got %v, not the shared *LoadError", i, err)
		}
	}
	// Within the back-off the error comes back without a new attempt.
	_, err := generate(context.Background(), srv, "bad", 2)
	var again *prewarm.LoadError
	if !errors.As(err, &again) || again != first || again.Attempts != 1 {
		t.Fatalf("request during back-off: %v (attempts %d), want the same error", err, again.Attempts)
	}
	st := status(srv, "bad")
	if st.State != prewarm.StateFailed || st.Err != first {
		t.Fatalf("status %+v, want failed with the load's error", st)
	}
	// The other model serves meanwhile.
	mustGenerate(t, srv, "good")
	// After the back-off the next request tries again, and the back-off doubles.
	time.Sleep(time.Until(first.RetryAt) + 10*time.Millisecond)
	_, err = generate(context.Background(), srv, "bad", 2)
	var second *prewarm.LoadError
	if !errors.As(err, &second) || second == first || second.Attempts != 2 {
		t.Fatalf("after the back-off: %v, want a second attempt", err)
	}
	if wait := time.Until(second.RetryAt); wait < 250*time.Millisecond || wait > 300*time.Millisecond {
		t.Fatalf("second back-off %v, want 300ms (doubled, capped)", wait)
	}
	if n := sim.Stats().Loads; n != 1 {
		t.Fatalf("%d successful loads, want 1 (the good model)", n)
	}
	// A fixed spec ends the back-off: the next request loads it.
	register(t, srv, prewarm.Model{Spec: engine.ModelSpec{ID: "bad", MaxBatch: 4}})
	mustGenerate(t, srv, "bad")
}

// budgetServer serves models of 1000 bytes each under a budget of 2500:
// two fit.
func budgetServer(t *testing.T, simOpts ...enginetest.SimOption) (*enginetest.Sim, *mlxserving.Server) {
	return simServer(t, append([]enginetest.SimOption{enginetest.WithMemory(1000, 0)}, simOpts...), mlxserving.WithMemoryBudget(2500))
}

func TestEvictsLeastRecentlyUsedIdle(t *testing.T) {
	sim, srv := budgetServer(t)
	register(t, srv, simModel("a"), simModel("b"), simModel("c"))
	mustGenerate(t, srv, "a")
	mustGenerate(t, srv, "b")
	mustGenerate(t, srv, "a") // b is now the least recently used
	mustGenerate(t, srv, "c")
	want := map[string]prewarm.State{"a": prewarm.StateLoaded, "b": prewarm.StateUnloaded, "c": prewarm.StateLoaded}
	if got := states(srv); !equalStates(got, want) {
		t.Fatalf("states %v, want %v", got, want)
	}
	if used, budget := srv.Memory(); used != 2000 || budget != 2500 {
		t.Fatalf("memory %d of %d, want 2000 of 2500", used, budget)
	}
	if st := status(srv, "b"); st.Evictions != 1 {
		t.Fatalf("b evicted %d times, want 1", st.Evictions)
	}
	if n := sim.Stats().Models; n != 2 {
		t.Fatalf("engine holds %d models, want 2", n)
	}
}

func equalStates(a, b map[string]prewarm.State) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestPinnedModelsAreNeverEvicted(t *testing.T) {
	_, srv := budgetServer(t)
	pinned := simModel("pinned")
	pinned.Pin = true
	register(t, srv, pinned, simModel("b"), simModel("c"))
	mustGenerate(t, srv, "pinned")
	mustGenerate(t, srv, "b")
	mustGenerate(t, srv, "c") // pinned is the least recently used, b goes
	want := map[string]prewarm.State{"pinned": prewarm.StateLoaded, "b": prewarm.StateUnloaded, "c": prewarm.StateLoaded}
	if got := states(srv); !equalStates(got, want) {
		t.Fatalf("states %v, want %v", got, want)
	}
	// LoadModel pins too: with two pinned models nothing can make room.
	if err := srv.UnloadModel(context.Background(), "c"); err != nil {
		t.Fatal(err)
	}
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "explicit"}); err != nil {
		t.Fatal(err)
	}
	_, err := generate(context.Background(), srv, "b", 2)
	var be *prewarm.BudgetError
	if !errors.As(err, &be) || !errors.Is(err, prewarm.ErrOverBudget) || be.Need != 1000 || be.Used != 2000 || be.RetryAfterHint() <= 0 {
		t.Fatalf("with every loaded model pinned: %v, want a *BudgetError", err)
	}
	if st := status(srv, "b"); st.State != prewarm.StateUnloaded || st.Err != nil {
		t.Fatalf("b after a budget refusal: %+v, want unloaded without a load error (no back-off)", st)
	}
}

func TestBusyModelsAreNeverEvicted(t *testing.T) {
	_, srv := simServer(t, []enginetest.SimOption{enginetest.WithMemory(1000, 0), enginetest.WithStepTime(2*time.Millisecond, 0)},
		mlxserving.WithMemoryBudget(1500))
	register(t, srv, simModel("a"), simModel("b"))
	ctx := context.Background()
	// Generating on a keeps it busy; a second request waits in its queue.
	running, err := srv.Generate(ctx, api.Request{Model: "a", PromptTokens: []int32{1}, Params: api.Params{MaxTokens: 100, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := running.Recv(); err != nil {
		t.Fatal(err)
	}
	_, err = generate(ctx, srv, "b", 2)
	if !errors.Is(err, prewarm.ErrOverBudget) {
		t.Fatalf("loading b while a is busy: %v, want ErrOverBudget", err)
	}
	if st := status(srv, "a"); st.State != prewarm.StateLoaded || !st.Busy || !st.IdleUntil.IsZero() {
		t.Fatalf("a while busy: %+v", st)
	}
	if res, err := running.Collect(); err != nil || len(res.Tokens) != 99 {
		t.Fatalf("a's request: %d tokens, %v; want it to finish", len(res.Tokens), err)
	}
	// Idle now: b may take its place.
	mustGenerate(t, srv, "b")
	want := map[string]prewarm.State{"a": prewarm.StateUnloaded, "b": prewarm.StateLoaded}
	if got := states(srv); !equalStates(got, want) {
		t.Fatalf("states %v, want %v", got, want)
	}
}

func TestKeepAlive(t *testing.T) {
	_, srv := simServer(t, nil, mlxserving.WithManagerOptions(prewarm.WithKeepAlive(100*time.Millisecond)))
	forever := simModel("forever")
	forever.KeepAlive = -1
	register(t, srv, simModel("default"), forever, simModel("per-request"))
	mustGenerate(t, srv, "default")
	mustGenerate(t, srv, "forever")
	if st := status(srv, "default"); st.IdleUntil.IsZero() || time.Until(st.IdleUntil) > 100*time.Millisecond {
		t.Fatalf("default model idle until %v, want within 100ms", st.IdleUntil)
	}
	// keep_alive 0 on a request: unload as soon as it is idle.
	zero := time.Duration(0)
	st, err := srv.Generate(context.Background(), api.Request{Model: "per-request", PromptTokens: []int32{1}, Params: api.Params{MaxTokens: 2, KeepAlive: &zero}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Collect(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "per-request to unload", func() bool { return status(srv, "per-request").State == prewarm.StateUnloaded })
	waitFor(t, "default to unload", func() bool { return status(srv, "default").State == prewarm.StateUnloaded })
	time.Sleep(150 * time.Millisecond)
	if s := status(srv, "forever"); s.State != prewarm.StateLoaded || !s.IdleUntil.IsZero() {
		t.Fatalf("keep-alive -1 model: %+v, want loaded for good", s)
	}
	// An unloaded model loads again on its next request.
	mustGenerate(t, srv, "default")
	if s := status(srv, "default"); s.Loads != 2 || s.Evictions != 1 {
		t.Fatalf("default after reload: %+v", s)
	}
}

// A request's keep_alive applies to the time after that request: once the
// model unloads, its next load starts with the default again (as Ollama).
func TestRequestKeepAliveDoesNotStick(t *testing.T) {
	_, srv := simServer(t, nil)
	register(t, srv, simModel("m"))
	zero := time.Duration(0)
	st, err := srv.Generate(context.Background(), api.Request{Model: "m", PromptTokens: []int32{1}, Params: api.Params{MaxTokens: 2, KeepAlive: &zero}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Collect(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "m to unload after keep_alive 0", func() bool { return status(srv, "m").State == prewarm.StateUnloaded })
	mustGenerate(t, srv, "m") // no keep_alive: the default applies
	time.Sleep(100 * time.Millisecond)
	s := status(srv, "m")
	if s.State != prewarm.StateLoaded || s.KeepAlive != prewarm.DefaultKeepAlive {
		t.Fatalf("after a request without keep_alive: %+v, want loaded with keep-alive %v", s, prewarm.DefaultKeepAlive)
	}
}

func TestManagerRefusesBadInput(t *testing.T) {
	_, srv := simServer(t, nil)
	if err := srv.RegisterModel(prewarm.Model{}); !errors.Is(err, engine.ErrInvalidParam) {
		t.Fatalf("empty id: %v", err)
	}
	_, err := generate(context.Background(), srv, "unknown", 2)
	var nf *mlxserving.ModelNotFoundError
	if !errors.As(err, &nf) || !errors.Is(err, engine.ErrModelNotFound) {
		t.Fatalf("unknown model: %v, want ModelNotFoundError", err)
	}
	for _, o := range []prewarm.ManagerOption{prewarm.WithBudget(-1), prewarm.WithKeepAlive(0), prewarm.WithLoadBackoff(nil),
		prewarm.WithLoadTimeout(-1), prewarm.WithMaxWaiting(-1), prewarm.WithRetryAfter(0), prewarm.WithLogger(nil), prewarm.WithMeterProvider(nil)} {
		sim, _ := enginetest.NewSim()
		if _, err := mlxserving.New(sim, mlxserving.WithManagerOptions(o)); err == nil {
			t.Error("a bad manager option was accepted")
		}
	}
	if _, err := prewarm.NewManager(nil); err == nil {
		t.Error("nil host accepted")
	}
}

func TestLoadTimeoutAndCloseDuringLoad(t *testing.T) {
	sim, srv := simServer(t, []enginetest.SimOption{enginetest.WithLoadTime(time.Hour)},
		mlxserving.WithManagerOptions(prewarm.WithLoadTimeout(50*time.Millisecond)))
	register(t, srv, simModel("slow"))
	_, err := generate(context.Background(), srv, "slow", 2)
	if !errors.Is(err, prewarm.ErrLoadFailed) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow load: %v, want a load failure from the timeout", err)
	}
	// A request's own deadline ends its wait, not the load.
	register(t, srv, prewarm.Model{Spec: engine.ModelSpec{ID: "slow2"}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := generate(ctx, srv, "slow2", 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("request deadline: %v", err)
	}
	if st := status(srv, "slow2"); st.State != prewarm.StateLoading {
		t.Fatalf("slow2 is %v, want still loading", st.State)
	}
	// Close aborts the load and leaves nothing loaded.
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if n := sim.Stats().Models; n != 0 {
		t.Fatalf("%d models left in the engine", n)
	}
	if _, err := generate(context.Background(), srv, "slow2", 2); !errors.Is(err, mlxserving.ErrServerClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

func TestWaitingForALoadIsBounded(t *testing.T) {
	sim, srv := simServer(t, []enginetest.SimOption{enginetest.WithLoadTime(200 * time.Millisecond)},
		mlxserving.WithManagerOptions(prewarm.WithMaxWaiting(4)))
	register(t, srv, simModel("m"))
	results := make(chan error, 6)
	for range 6 {
		go func() {
			_, err := generate(context.Background(), srv, "m", 2)
			results <- err
		}()
	}
	var ok, full int
	for range 6 {
		err := <-results
		var qf *scheduler.QueueFullError
		switch {
		case err == nil:
			ok++
		case errors.As(err, &qf) && qf.MaxQueued == 4 && qf.RetryAfter > 0:
			full++
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	if ok != 4 || full != 2 {
		t.Fatalf("%d served, %d refused; want 4 and 2", ok, full)
	}
	if n := sim.Stats().Loads; n != 1 {
		t.Fatalf("%d loads", n)
	}
}

func TestLoadModelCancelledLeavesNothing(t *testing.T) {
	sim, srv := simServer(t, []enginetest.SimOption{enginetest.WithLoadTime(time.Hour)})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := srv.LoadModel(ctx, engine.ModelSpec{ID: "m"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LoadModel past its deadline: %v", err)
	}
	if n := sim.Stats().Models; n != 0 || len(srv.ModelStatus()) != 0 {
		t.Fatalf("after a cancelled LoadModel: %d engine models, status %+v", n, srv.ModelStatus())
	}
	// The id is free again.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	if err := srv.LoadModel(ctx2, engine.ModelSpec{ID: "m"}); errors.Is(err, mlxserving.ErrModelExists) {
		t.Fatalf("second LoadModel: %v", err)
	}
}

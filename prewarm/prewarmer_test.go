package prewarm_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/retry"
)

// recorder keeps the phase changes a PreWarmer reports.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) note(p prewarm.ModelProgress) {
	r.mu.Lock()
	r.events = append(r.events, p.ID+":"+p.Phase.String())
	r.mu.Unlock()
}

func (r *recorder) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

func TestPreWarmerOrderAndWarmth(t *testing.T) {
	sim, srv := simServer(t, []enginetest.SimOption{enginetest.WithMaxBatch(8), enginetest.WithCompileTime(5 * time.Millisecond),
		enginetest.WithLoadTime(5 * time.Millisecond)})
	var rec recorder
	low := simModel("low")
	high := simModel("high")
	high.Priority = 10
	mid := simModel("mid")
	mid.Priority = 5
	pw, err := prewarm.New(srv, []prewarm.Model{low, high, mid}, prewarm.WithOnChange(rec.note))
	if err != nil {
		t.Fatal(err)
	}
	if err := pw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer pw.Stop()
	if err := pw.Start(context.Background()); err == nil {
		t.Fatal("second Start accepted")
	}
	if err := pw.Ready(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := pw.Wait(context.Background()); err != nil { // every callback has run
		t.Fatal(err)
	}
	want := []string{"high:loading", "high:warming", "high:ready", "mid:loading", "mid:warming", "mid:ready", "low:loading", "low:warming", "low:ready"}
	if got := rec.list(); !slices.Equal(got, want) {
		t.Fatalf("phases %v, want %v", got, want)
	}
	st := pw.Status()
	if !st.Ready || st.Settled != 3 || st.Progress() != 1 {
		t.Fatalf("status %+v", st)
	}
	for _, m := range st.Models {
		if m.LoadTime < 5*time.Millisecond || m.WarmTime <= 0 || m.Attempts != 1 || m.Warm.Generations != 1 || m.Warm.Tokens != 8 {
			t.Errorf("%s: %+v", m.ID, m)
		}
		if !slices.Equal(m.Warm.BatchSizes, []int{1, 2, 4, 8}) {
			t.Errorf("%s warmed batch sizes %v", m.ID, m.Warm.BatchSizes)
		}
	}
	// Every bucket of every model compiled during warm-up; traffic finds
	// them warm.
	cold := sim.Stats().ColdSteps
	if cold != 12 {
		t.Fatalf("cold steps after pre-warming = %d, want 4 buckets x 3 models", cold)
	}
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() { defer wg.Done(); mustGenerate(t, srv, "high") }()
	}
	wg.Wait()
	if got := sim.Stats().ColdSteps; got != cold {
		t.Fatalf("traffic after pre-warming paid %d compilations", got-cold)
	}
	if err := pw.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestPreWarmerParallelAndReadyWhileWarming(t *testing.T) {
	_, srv := simServer(t, []enginetest.SimOption{enginetest.WithLoadTime(30 * time.Millisecond)})
	slow := prewarm.Model{Spec: engine.ModelSpec{ID: "slow"}, Priority: 1, Prompts: []string{"x"}} // no tokenizer: fails
	fast := simModel("fast")
	fast.Priority = 5
	other := simModel("other")
	other.Priority = 5
	pw, err := prewarm.New(srv, []prewarm.Model{slow, fast, other}, prewarm.WithConcurrency(2),
		prewarm.WithReadiness(prewarm.WhileWarming(5)))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := pw.CheckReady(context.Background()); !errors.Is(err, prewarm.ErrNotReady) {
		t.Fatalf("CheckReady before Start: %v", err)
	}
	if err := pw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer pw.Stop()
	if err := pw.Ready(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := pw.CheckReady(context.Background()); err != nil {
		t.Fatalf("CheckReady once ready: %v", err)
	}
	if took := time.Since(start); took > 55*time.Millisecond*3 {
		t.Logf("ready after %v", took)
	}
	// Both priority-5 models loaded side by side.
	st := pw.Status()
	if st.Models[0].Phase != prewarm.Ready || st.Models[1].Phase != prewarm.Ready {
		t.Fatalf("status %+v", st)
	}
	// The failing model does not stop the others, and says why.
	err = pw.Wait(context.Background())
	if !errors.Is(err, mlxserving.ErrNoTokenizer) {
		t.Fatalf("Wait: %v, want the slow model's tokenizer error", err)
	}
	st = pw.Status()
	if m := st.Models[2]; m.ID != "slow" || m.Phase != prewarm.Failed || m.Err == nil {
		t.Fatalf("slow: %+v", m)
	}
	// Nothing of the failed model stays loaded.
	if s := status(srv, "slow"); s.State != prewarm.StateUnloaded {
		t.Fatalf("failed model is %v", s.State)
	}
	// When complete can no longer be met.
	pw2, _ := prewarm.New(srv, []prewarm.Model{slow}, prewarm.WithReadiness(prewarm.WhenComplete()))
	_ = pw2.Start(context.Background())
	defer pw2.Stop()
	if err := pw2.Ready(context.Background()); !errors.Is(err, prewarm.ErrNotReady) {
		t.Fatalf("Ready with a failed model: %v, want ErrNotReady", err)
	}
}

func TestPreWarmerStopAbortsAndLeavesNothingLoaded(t *testing.T) {
	sim, srv := simServer(t, []enginetest.SimOption{enginetest.WithLoadTime(time.Hour)})
	var rec recorder
	loading := make(chan struct{})
	var once sync.Once
	pw, err := prewarm.New(srv, []prewarm.Model{simModel("a"), simModel("b")}, prewarm.WithOnChange(func(p prewarm.ModelProgress) {
		rec.note(p)
		if p.Phase == prewarm.Loading {
			once.Do(func() { close(loading) })
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := pw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-loading
	start := time.Now()
	pw.Stop()
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Stop took %v", took)
	}
	st := pw.Status()
	for _, m := range st.Models {
		if m.Phase != prewarm.Aborted {
			t.Errorf("%s is %v, want aborted", m.ID, m.Phase)
		}
	}
	if n := sim.Stats().Models; n != 0 {
		t.Fatalf("%d models loaded after Stop", n)
	}
	for id, s := range states(srv) {
		if s != prewarm.StateUnloaded {
			t.Fatalf("%s is %v after Stop", id, s)
		}
	}
	pw.Stop() // idempotent
	if err := pw.Ready(context.Background()); !errors.Is(err, prewarm.ErrNotReady) {
		t.Fatalf("Ready after abort: %v", err)
	}
}

func TestPreWarmerCancelledContextAndBadInput(t *testing.T) {
	_, srv := simServer(t, []enginetest.SimOption{enginetest.WithLoadTime(time.Hour)})
	ctx, cancel := context.WithCancel(context.Background())
	pw, err := prewarm.New(srv, []prewarm.Model{simModel("a")}, prewarm.WithModelTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := pw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-pw.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("cancelling Start's context did not end the PreWarmer")
	}
	if m := pw.Status().Models[0]; m.Phase != prewarm.Aborted || !errors.Is(m.Err, context.Canceled) {
		t.Fatalf("after cancel: %+v", m)
	}
	pw.Stop()

	unstarted, _ := prewarm.New(srv, []prewarm.Model{simModel("b")})
	unstarted.Stop()
	if m := unstarted.Status().Models[0]; m.Phase != prewarm.Aborted {
		t.Fatalf("Stop without Start: %+v", m)
	}

	for name, f := range map[string]func() (*prewarm.PreWarmer, error){
		"nil target": func() (*prewarm.PreWarmer, error) { return prewarm.New(nil, nil) },
		"duplicate id": func() (*prewarm.PreWarmer, error) {
			return prewarm.New(srv, []prewarm.Model{simModel("a"), simModel("a")})
		},
		"empty id":      func() (*prewarm.PreWarmer, error) { return prewarm.New(srv, []prewarm.Model{{}}) },
		"concurrency 0": func() (*prewarm.PreWarmer, error) { return prewarm.New(srv, nil, prewarm.WithConcurrency(0)) },
		"timeout 0":     func() (*prewarm.PreWarmer, error) { return prewarm.New(srv, nil, prewarm.WithModelTimeout(0)) },
		"retries -1":    func() (*prewarm.PreWarmer, error) { return prewarm.New(srv, nil, prewarm.WithWarmRetries(-1)) },
		"nil callback":  func() (*prewarm.PreWarmer, error) { return prewarm.New(srv, nil, prewarm.WithOnChange(nil)) },
		"nil logger":    func() (*prewarm.PreWarmer, error) { return prewarm.New(srv, nil, prewarm.WithLogger(nil)) },
	} {
		if _, err := f(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestPreWarmerModelTimeout(t *testing.T) {
	_, srv := simServer(t, []enginetest.SimOption{enginetest.WithLoadTime(time.Hour)})
	pw, err := prewarm.New(srv, []prewarm.Model{simModel("a")}, prewarm.WithModelTimeout(30*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	_ = pw.Start(context.Background())
	defer pw.Stop()
	if err := pw.Wait(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait: %v, want the model's timeout", err)
	}
	if m := pw.Status().Models[0]; m.Phase != prewarm.Failed {
		t.Fatalf("%+v, want failed", m)
	}
	if s := status(srv, "a"); s.State != prewarm.StateUnloaded {
		t.Fatalf("a is %v after its timeout", s.State)
	}
}

func TestPreWarmerRegistersEveryModelAtStart(t *testing.T) {
	_, srv := simServer(t, []enginetest.SimOption{enginetest.WithLoadTime(50 * time.Millisecond)})
	pw, err := prewarm.New(srv, []prewarm.Model{simModel("first"), simModel("later")})
	if err != nil {
		t.Fatal(err)
	}
	if err := pw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer pw.Stop()
	// "later" is still pending: a request for it loads it on demand, and
	// the pre-warmer's own load later shares or finds it.
	mustGenerate(t, srv, "later")
	if err := pw.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := status(srv, "later"); st.Loads != 1 {
		t.Fatalf("later loaded %d times, want 1", st.Loads)
	}
}

// Server-wide request deadlines do not apply to warm-up generations: a
// first-token deadline shorter than a cold step cannot stop start-up.
func TestWarmUpIgnoresRequestDeadlines(t *testing.T) {
	_, srv := simServer(t, []enginetest.SimOption{enginetest.WithStepTime(5*time.Millisecond, 0), enginetest.WithCompileTime(20 * time.Millisecond)},
		mlxserving.WithDeadlines(retry.Deadlines{FirstToken: time.Millisecond, Total: 2 * time.Millisecond}))
	pw, err := prewarm.New(srv, []prewarm.Model{simModel("m")})
	if err != nil {
		t.Fatal(err)
	}
	if err := pw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer pw.Stop()
	if err := pw.Ready(context.Background()); err != nil {
		t.Fatalf("not ready with a 1ms first-token deadline: %v", err)
	}
	// Requests still get the deadline.
	st, err := srv.Generate(context.Background(), api.Request{Model: "m", PromptTokens: []int32{1, 2}, Params: api.Params{MaxTokens: 50}})
	if err == nil {
		_, err = st.Collect()
	}
	var de *retry.DeadlineError
	if !errors.As(err, &de) {
		t.Fatalf("request under a 2ms total deadline: %v, want a *retry.DeadlineError", err)
	}
}

package balancer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/retry"
)

// instance is a Server over its own simulated engine: one backend.
type instance struct {
	srv *mlxserving.Server
	eng *enginetest.Sim
}

func newInstance(t testing.TB, step time.Duration, models ...string) *instance {
	t.Helper()
	eng, err := enginetest.NewSim(enginetest.WithStepTime(step, 0), enginetest.WithMaxBatch(32))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := mlxserving.New(eng)
	if err != nil {
		t.Fatal(err)
	}
	if len(models) == 0 {
		models = []string{"m"}
	}
	for _, id := range models {
		if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	in := &instance{srv: srv, eng: eng}
	t.Cleanup(func() { _ = srv.Close(); _ = eng.Close() })
	return in
}

func newBalancer(t testing.TB, opts ...balancer.Option) *balancer.LoadBalancer {
	t.Helper()
	lb, err := balancer.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lb.Close() })
	return lb
}

func request(model string, tokens int) api.Request {
	return api.Request{Model: model, PromptTokens: []int32{1, 2, 3, 4}, Params: api.Params{MaxTokens: tokens, IgnoreEOS: true}}
}

func TestBalancerRoundRobinSpreadsAndCompletes(t *testing.T) {
	lb := newBalancer(t, balancer.WithStrategy(balancer.RoundRobin()))
	for i := range 3 {
		if err := lb.Add(fmt.Sprintf("b%d", i), newInstance(t, 0).srv); err != nil {
			t.Fatal(err)
		}
	}
	for range 30 {
		st, err := lb.Generate(context.Background(), request("m", 4))
		if err != nil {
			t.Fatal(err)
		}
		res, err := st.Collect()
		if err != nil || len(res.Tokens) != 4 {
			t.Fatalf("result %+v, %v", res, err)
		}
	}
	for _, b := range lb.Stats().Backends {
		if b.Routed != 10 {
			t.Errorf("backend %s routed %d requests, want 10", b.Name, b.Routed)
		}
		if b.InFlight != 0 {
			t.Errorf("backend %s still has %d in flight", b.Name, b.InFlight)
		}
	}
}

func TestBalancerRoutesByModel(t *testing.T) {
	lb := newBalancer(t)
	_ = lb.Add("a", newInstance(t, 0, "llama").srv)
	_ = lb.Add("b", newInstance(t, 0, "qwen").srv)
	for _, model := range []string{"llama", "qwen", "qwen", "llama"} {
		st, err := lb.Generate(context.Background(), request(model, 2))
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"llama": "a", "qwen": "b"}[model]
		if got := st.Header().Backend; got != want {
			t.Errorf("model %s went to %s, want %s", model, got, want)
		}
		if _, err := st.Collect(); err != nil {
			t.Fatal(err)
		}
	}
	// A model no backend has is not found, as a Server answers, not a
	// backend that is down.
	_, err := lb.Generate(context.Background(), request("mistral", 2))
	if !errors.Is(err, engine.ErrModelNotFound) || errors.Is(err, balancer.ErrNoBackend) {
		t.Fatalf("unknown model: %v, want engine.ErrModelNotFound", err)
	}
	if got := lb.Load().Models; strings.Join(got, ",") != "llama,qwen" {
		t.Errorf("Load().Models = %v", got)
	}
}

func TestBalancerFailsOverBeforeFirstToken(t *testing.T) {
	lb := newBalancer(t, balancer.WithStrategy(balancer.RoundRobin()))
	dead, live := newInstance(t, 0), newInstance(t, 0)
	_ = lb.Add("a-dead", dead.srv)
	_ = lb.Add("b-live", live.srv)
	_ = dead.srv.Close() // refuses everything from now on, as a killed instance would
	for i := range 20 {
		st, err := lb.Generate(context.Background(), request("m", 3))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if st.Header().Backend != "b-live" {
			t.Errorf("request %d served by %s", i, st.Header().Backend)
		}
		if _, err := st.Collect(); err != nil {
			t.Fatal(err)
		}
	}
	st := lb.Stats()
	if st.Failovers == 0 {
		t.Error("no failovers counted")
	}
	var deadStats balancer.BackendStats
	for _, b := range st.Backends {
		if b.Name == "a-dead" {
			deadStats = b
		}
	}
	if deadStats.Breaker.State != retry.StateOpen {
		t.Errorf("dead backend's breaker is %v, want open (ejected)", deadStats.Breaker.State)
	}
}

func TestBalancerBadInputIsNotFailedOver(t *testing.T) {
	lb := newBalancer(t)
	a, b := newInstance(t, 0), newInstance(t, 0)
	_ = lb.Add("a", a.srv)
	_ = lb.Add("b", b.srv)
	req := request("m", 0) // max_tokens 0 is invalid
	_, err := lb.Generate(context.Background(), req)
	if !errors.Is(err, engine.ErrInvalidParam) {
		t.Fatalf("got %v, want ErrInvalidParam", err)
	}
	if st := lb.Stats(); st.Failovers != 0 || st.Refused != 0 {
		t.Errorf("bad input was failed over: %+v", st)
	}
}

func TestBalancerMidStreamDeathIsExplicit(t *testing.T) {
	lb := newBalancer(t)
	in := newInstance(t, 5*time.Millisecond)
	_ = lb.Add("only", in.srv)
	st, err := lb.Generate(context.Background(), request("m", 1000))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for range 3 {
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	_ = in.srv.Close()
	for {
		_, err := st.Recv()
		if err == nil {
			continue
		}
		var ie *retry.InterruptedError
		if !errors.As(err, &ie) || ie.Delivered < 3 {
			t.Fatalf("after tokens were sent: %v, want *retry.InterruptedError", err)
		}
		break
	}
	if lb.Stats().Interrupted != 1 {
		t.Errorf("interrupted = %d", lb.Stats().Interrupted)
	}
}

func TestBalancerAllDownIsNoBackend(t *testing.T) {
	lb := newBalancer(t)
	for i := range 3 {
		in := newInstance(t, 0)
		_ = lb.Add(fmt.Sprintf("b%d", i), in.srv)
		_ = in.srv.Close()
	}
	// Backends that are there and refuse do not make a request wait for
	// another to be added (WithBackendWait): it is refused well inside
	// this deadline, half the default wait.
	ctx, cancel := context.WithTimeout(context.Background(), balancer.DefaultBackendWait/2)
	defer cancel()
	_, err := lb.Generate(ctx, request("m", 2))
	var nb *balancer.NoBackendError
	if !errors.As(err, &nb) || nb.Tried == 0 {
		t.Fatalf("got %v, want *NoBackendError", err)
	}
}

// TestBalancerWaitsForABackend: a request that finds no backend for its
// model — none added yet, or every one removed, as a NATS discovery does
// for a moment while an instance's connection moves to another node —
// waits for one to be added and is served by it; with WithBackendWait(0)
// it is refused at once.
func TestBalancerWaitsForABackend(t *testing.T) {
	lb := newBalancer(t)
	gone := newInstance(t, 0)
	if err := lb.Add("gone", gone.srv); err != nil {
		t.Fatal(err)
	}
	lb.Remove("gone")
	late := newInstance(t, 0)
	added := make(chan error, 1)
	go func() {
		time.Sleep(50 * time.Millisecond)
		added <- lb.Add("late", late.srv)
	}()
	st, err := lb.Generate(context.Background(), request("m", 3))
	if err != nil {
		t.Fatalf("a request while no backend was there: %v", err)
	}
	if res, err := st.Collect(); err != nil || len(res.Tokens) != 3 {
		t.Fatalf("result %+v, %v", res, err)
	}
	if err := <-added; err != nil {
		t.Fatal(err)
	}
	if b := lb.Stats().Backends; len(b) != 1 || b[0].Name != "late" || b[0].Routed != 1 {
		t.Errorf("backends %+v, want the late one to have served the request", b)
	}

	now := newBalancer(t, balancer.WithBackendWait(0))
	_, err = now.Generate(context.Background(), request("m", 3))
	var nb *balancer.NoBackendError
	if !errors.As(err, &nb) {
		t.Fatalf("without a wait: %v, want *NoBackendError", err)
	}

	// A request whose context ends while it waits gets its context's
	// error, not a refusal.
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if _, err := newBalancer(t).Generate(ctx, request("m", 3)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while waiting: %v, want context.Canceled", err)
	}
}

func TestBalancerSessionAffinity(t *testing.T) {
	lb := newBalancer(t, balancer.WithStrategy(balancer.SessionAffinity(0, balancer.RoundRobin())))
	for i := range 3 {
		_ = lb.Add(fmt.Sprintf("b%d", i), newInstance(t, 0).srv)
	}
	homes := map[string]string{}
	for turn := range 4 {
		for s := range 6 {
			req := request("m", 2)
			req.Session = fmt.Sprintf("s%d", s)
			st, err := lb.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			got := st.Header().Backend
			if turn > 0 && homes[req.Session] != got {
				t.Errorf("session %s moved from %s to %s", req.Session, homes[req.Session], got)
			}
			homes[req.Session] = got
			if _, err := st.Collect(); err != nil {
				t.Fatal(err)
			}
		}
	}
	used := map[string]bool{}
	for _, b := range homes {
		used[b] = true
	}
	if len(used) < 2 {
		t.Errorf("6 sessions all homed on %v", used)
	}
}

func TestBalancerPrefixAwareKeepsSharedPrefixTogether(t *testing.T) {
	lb := newBalancer(t, balancer.WithStrategy(balancer.PrefixAware(0, 0, 0)))
	for i := range 3 {
		_ = lb.Add(fmt.Sprintf("b%d", i), newInstance(t, 0).srv)
	}
	system := strings.Repeat("You are a careful assistant. ", 20)
	var first string
	for u := range 8 {
		req := api.Request{Model: "m", Prompt: system + fmt.Sprintf("question %d", u), PromptTokens: []int32{1, 2}, Params: api.Params{MaxTokens: 2, IgnoreEOS: true}}
		st, err := lb.Generate(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if u == 0 {
			first = st.Header().Backend
		} else if got := st.Header().Backend; got != first {
			t.Errorf("user %d with the shared prefix went to %s, first went to %s", u, got, first)
		}
		if _, err := st.Collect(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBalancersNest(t *testing.T) {
	inner1, inner2 := newBalancer(t), newBalancer(t)
	_ = inner1.Add("x", newInstance(t, 0).srv)
	_ = inner2.Add("y", newInstance(t, 0).srv)
	outer := newBalancer(t, balancer.WithStrategy(balancer.RoundRobin()))
	_ = outer.Add("left", inner1)
	_ = outer.Add("right", inner2)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := outer.Chat(context.Background(), api.ChatRequest{Model: "m", Messages: []api.Message{{Role: "user", Content: "hi"}}, Params: api.Params{MaxTokens: 2}})
			if err == nil {
				_, err = st.Collect()
			}
			if err != nil && !errors.Is(err, mlxserving.ErrNoTokenizer) {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for range 4 {
		st, err := outer.Generate(context.Background(), request("m", 2))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Collect(); err != nil {
			t.Fatal(err)
		}
	}
	if l := outer.Load(); len(l.Models) != 1 || l.Models[0] != "m" {
		t.Errorf("nested Load().Models = %v", l.Models)
	}
}

func TestBalancerDrainWaitsForInFlight(t *testing.T) {
	lb := newBalancer(t)
	in := newInstance(t, 2*time.Millisecond)
	_ = lb.Add("a", in.srv)
	_ = lb.Add("b", newInstance(t, 0).srv)
	st, err := lb.Generate(context.Background(), request("m", 20))
	if err != nil {
		t.Fatal(err)
	}
	name := st.Header().Backend
	done := make(chan error, 1)
	go func() { done <- lb.Drain(context.Background(), name) }()
	res, err := st.Collect()
	if err != nil || len(res.Tokens) != 20 {
		t.Fatalf("draining backend's stream: %+v %v", res, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, b := range lb.Stats().Backends {
		if b.Name == name {
			t.Errorf("drained backend %s still listed", name)
		}
	}
}

func TestBalancerOptionsValidated(t *testing.T) {
	for _, opt := range []balancer.Option{
		balancer.WithStrategy(nil), balancer.WithFailoverAttempts(0),
		balancer.WithHealthCheck(-1, time.Second), balancer.WithAffinityStore(nil, 0),
		balancer.WithPrefixIndexSize(0), balancer.WithLogger(nil), balancer.WithMeterProvider(nil),
		balancer.WithLoadRefresh(0), balancer.WithAffinityRefresh(-time.Second), balancer.WithBackendWait(-time.Second),
		balancer.WithBreaker(retry.WithOpenTimeout(0)), // once refused only by Add
	} {
		if _, err := balancer.New(opt); err == nil {
			t.Error("bad option accepted")
		}
	}
}

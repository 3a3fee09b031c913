package natsbackend_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/internal/syncbuf"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
)

func greedy(n int) api.Params { return api.Params{MaxTokens: n, IgnoreEOS: true} }

func genReq(n int) api.Request {
	return api.Request{Model: "tiny", Prompt: "Once upon a time", Params: greedy(n)}
}

// TestDiscoverAndServe: two instances are found, requests through the
// balancer reach both, and a completion over NATS matches the Server's.
func TestDiscoverAndServe(t *testing.T) {
	n := startNATS(t)
	a := startInstance(t, n, "a")
	startInstance(t, n, "b")
	lb, d := newBalancer(t, n)
	waitInstances(t, d, "a", "b")
	waitFor(t, "load reports", func() bool {
		for _, b := range lb.Stats().Backends {
			if !b.Load.Serves("tiny") {
				return false
			}
		}
		return len(lb.Stats().Backends) == 2
	})
	want, err := mustCollect(a.srv.Generate(context.Background(), genReq(12)))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for range 6 {
		st, err := lb.Generate(context.Background(), genReq(12))
		if err != nil {
			t.Fatal(err)
		}
		seen[st.Header().Backend] = true
		res, err := st.Collect()
		if err != nil {
			t.Fatal(err)
		}
		if res.Text != want.Text || len(res.Tokens) != 12 || res.Usage.CompletionTokens != 12 || res.Finish != api.FinishLength {
			t.Fatalf("over NATS %+v, direct %+v", res, want)
		}
	}
	if !seen["a"] || !seen["b"] {
		t.Errorf("requests reached %v, want both instances", seen)
	}
	chat := api.ChatRequest{Model: "tiny", Messages: []api.Message{{Role: "user", Content: "Hi"}}, Params: greedy(5)}
	res, err := mustCollect(lb.Chat(context.Background(), chat))
	if err != nil || res.Usage.CompletionTokens != 5 {
		t.Fatalf("chat: %+v %v", res, err)
	}
}

func mustCollect(st *api.Stream, err error) (api.Result, error) {
	if err != nil {
		return api.Result{}, err
	}
	return st.Collect()
}

// client returns the natsbackend.Client discovery made for instance name.
func client(t *testing.T, d *natsbackend.Discovery, name string) balancer.Backend {
	t.Helper()
	var c *natsbackend.Client
	waitFor(t, "client for "+name, func() bool {
		c = d.Client(name)
		return c != nil
	})
	return c
}

// TestTypedErrors: refusals cross NATS as typed errors.
func TestTypedErrors(t *testing.T) {
	n := startNATS(t)
	startInstance(t, n, "a")
	_, d := newBalancer(t, n)
	waitInstances(t, d, "a")
	c := client(t, d, "a")
	_, err := c.Generate(context.Background(), api.Request{Model: "nope", Prompt: "x", Params: greedy(2)})
	var ne *natsbackend.Error
	if !errors.As(err, &ne) || ne.Retryable() || !errors.Is(err, engine.ErrModelNotFound) {
		t.Fatalf("unknown model: %v", err)
	}
	_, err = c.Generate(context.Background(), api.Request{Model: "tiny", Prompt: "x", Params: api.Params{MaxTokens: 2, Sampling: engine.SamplingParams{Temperature: 1, TopK: -1}}})
	var ip *engine.InvalidParamError
	if !errors.As(err, &ip) || ip.Param != "top_k" {
		t.Fatalf("bad top_k: %v", err)
	}
	_, err = c.Generate(context.Background(), api.Request{Model: "tiny", Prompt: "x", Params: greedy(100000)})
	var cl *engine.ContextLengthError
	if !errors.Is(err, engine.ErrContextLength) || !errors.As(err, &cl) || cl.Limit == 0 || cl.MaxNew != 100000 {
		t.Fatalf("too long: %v, want a *engine.ContextLengthError with its numbers", err)
	}
}

// TestRetryAfterCrossesNATS: a refusal's retry-after arrives as sent.
func TestRetryAfterCrossesNATS(t *testing.T) {
	for _, err := range []error{
		&scheduler.QueueFullError{Queued: 3, MaxQueued: 3, Cost: 1, RetryAfter: 7 * time.Second},
		&scheduler.RateLimitError{Client: "k", RetryAfter: 7 * time.Second},
	} {
		got := natsbackend.FromWireForTest("i", err)
		if d, ok := retry.RetryAfter(got); !ok || d != 7*time.Second {
			t.Errorf("%T over NATS: retry after %v, %v; want 7s", err, d, ok)
		}
		var qf *scheduler.QueueFullError
		if errors.As(err, &qf) && !errors.As(got, &qf) {
			t.Errorf("%v over NATS is no *scheduler.QueueFullError", got)
		}
	}
}

// TestCancelStopsGeneration: closing the stream on the client stops the
// generation on the instance.
func TestCancelStopsGeneration(t *testing.T) {
	n := startNATS(t)
	a := startInstance(t, n, "a", enginetest.WithStepTime(5*time.Millisecond, 0))
	_, d := newBalancer(t, n)
	waitInstances(t, d, "a")
	st, err := client(t, d, "a").Generate(context.Background(), genReq(400))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	if a.sim.Stats().OpenSequences != 1 {
		t.Fatalf("open sequences %d", a.sim.Stats().OpenSequences)
	}
	st.Close()
	waitFor(t, "generation stopped", func() bool { return a.sim.Stats().OpenSequences == 0 })
}

// TestFlowControl: a slow reader with a small window gets every chunk in
// order; the instance waits for credit rather than flooding it.
func TestFlowControl(t *testing.T) {
	n := startNATS(t)
	a := startInstance(t, n, "a")
	_, d := newBalancer(t, n, natsbackend.WithCreditWindow(4))
	waitInstances(t, d, "a")
	want, err := mustCollect(a.srv.Generate(context.Background(), genReq(200)))
	if err != nil {
		t.Fatal(err)
	}
	st, err := client(t, d, "a").Generate(context.Background(), genReq(200))
	if err != nil {
		t.Fatal(err)
	}
	var got []int32
	for c, err := range st.Chunks() {
		if err != nil {
			t.Fatal(err)
		}
		if c.HasToken {
			got = append(got, c.Token)
		}
		if len(got)%50 == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if len(got) != 200 || !equal(got, want.Tokens) {
		t.Fatalf("got %d tokens, want the Server's 200", len(got))
	}
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestInstanceDeath: an instance whose service stops, or whose
// connection dies, is dropped within the timeout, and its stream in
// flight ends with an explicit error.
func TestInstanceDeath(t *testing.T) {
	n := startNATS(t)
	a := startInstance(t, n, "a", enginetest.WithStepTime(5*time.Millisecond, 0))
	b := startInstance(t, n, "b", enginetest.WithStepTime(5*time.Millisecond, 0))
	lb, d := newBalancer(t, n)
	waitInstances(t, d, "a", "b")

	for _, tc := range []struct {
		in   *instance
		kill func()
		left []string
	}{
		{a, func() { _ = a.svc.Stop() }, []string{"b"}},
		{b, func() { b.nc.Close() }, nil},
	} {
		st, err := client(t, d, tc.in.name).Generate(context.Background(), genReq(400))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		tc.kill()
		var rerr error
		for rerr == nil {
			_, rerr = st.Recv()
		}
		var ie *retry.InterruptedError
		if !errors.As(rerr, &ie) {
			t.Errorf("%s: stream ended with %v, want an InterruptedError", tc.in.name, rerr)
		}
		waitInstances(t, d, tc.left...)
		if since := time.Since(killed); since > 2*time.Second {
			t.Errorf("%s dropped after %v, bound 500ms + an interval", tc.in.name, since)
		}
	}
	_, err := lb.Generate(context.Background(), genReq(2))
	var nb *balancer.NoBackendError
	if !errors.As(err, &nb) {
		t.Errorf("all instances gone: %v, want *NoBackendError", err)
	}
}

// TestNATSRestart: with the NATS server gone, requests fail with a clear
// error and the instances are dropped; when it is back they are found
// again and serve.
func TestNATSRestart(t *testing.T) {
	n := startNATS(t)
	startInstance(t, n, "a")
	var logs syncbuf.Buffer
	lb, d := newBalancer(t, n, natsbackend.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	waitInstances(t, d, "a")
	c := client(t, d, "a")
	n.stop()
	waitInstances(t, d) // dropped within the timeout
	start := time.Now()
	_, err := c.Generate(context.Background(), genReq(2))
	if time.Since(start) > time.Second {
		t.Errorf("request with NATS down took %v", time.Since(start))
	}
	var ne *natsbackend.Error
	if !errors.As(err, &ne) || !ne.Retryable() || !errors.Is(err, natsbackend.ErrNotConnected) {
		t.Fatalf("NATS down: %v, want a retryable *Error, ErrNotConnected", err)
	}
	var nb *balancer.NoBackendError
	if _, err := lb.Generate(context.Background(), genReq(2)); !errors.As(err, &nb) {
		t.Errorf("balancer with NATS down: %v, want *NoBackendError", err)
	}
	n.start()
	waitInstances(t, d, "a")
	waitFor(t, "load after restart", func() bool {
		bs := lb.Stats().Backends
		return len(bs) == 1 && bs[0].Load.Serves("tiny")
	})
	if res, err := mustCollect(lb.Generate(context.Background(), genReq(4))); err != nil || res.Usage.CompletionTokens != 4 {
		t.Fatalf("after restart: %+v %v", res, err)
	}
	for _, want := range []string{"NATS unreachable", "NATS reachable again", "instance stopped answering; removed"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("discovery logged no %q:\n%s", want, logs.String())
		}
	}
}

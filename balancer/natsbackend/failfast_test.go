package natsbackend_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// TestDeadInstanceFailsOverFast: requests queued on an instance whose
// connection dies (as a kill -9 leaves it) fail over to another instance
// within about a probe interval, not after three missed heartbeats (6 s
// here) or the discovery timeout (10 s here), and the instance leaves the
// registry as fast; its stream that had produced tokens resumes on b.
func TestDeadInstanceFailsOverFast(t *testing.T) {
	n := startNATS(t)
	a := startInstance(t, n, "a", enginetest.WithStepTime(5*time.Millisecond, 0), enginetest.WithMaxBatch(1))
	lb, d := newBalancer(t, n, natsbackend.WithTimeout(10*time.Second), natsbackend.WithHeartbeat(2*time.Second),
		natsbackend.WithProbeInterval(100*time.Millisecond))
	waitInstances(t, d, "a")
	running, err := lb.Generate(context.Background(), genReq(400))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := running.Recv(); err != nil {
		t.Fatal(err)
	}
	var queued []*api.Stream
	for range 3 {
		st, err := lb.Generate(context.Background(), genReq(4))
		if err != nil {
			t.Fatal(err)
		}
		queued = append(queued, st)
	}
	startInstance(t, n, "b")
	waitInstances(t, d, "a", "b")

	killed := time.Now()
	a.nc.Close() // no goodbye, as a kill -9 leaves it
	for i, st := range queued {
		res, err := st.Collect()
		if err != nil || res.Usage.CompletionTokens != 4 {
			t.Fatalf("queued request %d: %+v, %v", i, res.Usage, err)
		}
		if st.Header().Backend != "a" {
			t.Errorf("queued request %d was placed on %q, want a", i, st.Header().Backend)
		}
	}
	if since := time.Since(killed); since > time.Second {
		t.Errorf("queued requests failed over after %v, want under 1 s", since)
	}
	waitInstances(t, d, "b")
	if since := time.Since(killed); since > time.Second {
		t.Errorf("a left the registry after %v, want under 1 s", since)
	}
	// The stream that had produced tokens goes on on b (the balancer
	// resumes it from the tokens delivered) and ends whole.
	res, err := running.Collect()
	if err != nil || res.Usage.CompletionTokens != 400 {
		t.Errorf("stream cut by the death: %+v, %v; want all 400 tokens, resumed on b", res.Usage, err)
	}
}

// TestReconnectGrace: while the NATS connection reconnects, a request
// waits up to the grace for it (moving to another server of a cluster
// takes milliseconds) before it fails with ErrNotConnected; its context
// ends the wait sooner.
func TestReconnectGrace(t *testing.T) {
	n := startNATS(t)
	startInstance(t, n, "a")
	lb, err := balancer.New()
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	nc := n.connect(t, "balancer")
	d, err := natsbackend.Discover(context.Background(), nc, lb, natsbackend.WithInterval(50*time.Millisecond),
		natsbackend.WithReconnectGrace(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	waitInstances(t, d, "a")
	c := d.Client("a")
	n.stop()
	waitFor(t, "the connection reconnecting", nc.IsReconnecting)
	began := time.Now()
	_, err = c.Generate(context.Background(), genReq(2))
	if waited := time.Since(began); !errors.Is(err, natsbackend.ErrNotConnected) || waited < 300*time.Millisecond || waited > 2*time.Second {
		t.Fatalf("NATS down: %v after %v; want ErrNotConnected after the 300ms grace", err, waited)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	began = time.Now()
	if _, err := c.Generate(ctx, genReq(2)); !errors.Is(err, context.DeadlineExceeded) || time.Since(began) > 250*time.Millisecond {
		t.Fatalf("with a 50ms context: %v after %v", err, time.Since(began))
	}
}

// TestDeadInstanceResumesFast: a stream whose instance dies after tokens
// reached the caller ends as soon as discovery finds the instance gone
// (a probe answered "no responders"), not after three missed heartbeats
// (6 s here), and the balancer resumes it on another instance: the
// caller's longest wait between two chunks stays far below the heartbeat
// timeout. The bound is loose (a loaded machine); BENCHMARKS.md has the
// figures.
func TestDeadInstanceResumesFast(t *testing.T) {
	n := startNATS(t)
	a := startInstance(t, n, "a", enginetest.WithStepTime(5*time.Millisecond, 0))
	lb, d := newBalancer(t, n, natsbackend.WithTimeout(10*time.Second), natsbackend.WithHeartbeat(2*time.Second),
		natsbackend.WithProbeInterval(100*time.Millisecond))
	waitInstances(t, d, "a")
	st, err := lb.Generate(context.Background(), genReq(200))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	startInstance(t, n, "b", enginetest.WithStepTime(5*time.Millisecond, 0))
	waitInstances(t, d, "a", "b")

	longest, usage := readResumed(t, st, 200, "b", func() {
		a.nc.Close() // no goodbye, as a kill -9 leaves it
	})
	if longest > 2*time.Second || usage.ResumeGap > 2*time.Second {
		t.Errorf("the caller waited %v between chunks (resume gap %v); want well under the 6 s heartbeat timeout", longest, usage.ResumeGap)
	}
	t.Logf("longest wait between chunks %v, resume gap %v", longest, usage.ResumeGap)
}

// readResumed reads st to its end, calling fault after its 10th token,
// and checks that it delivered want tokens, resumed once on backend to.
// It returns the longest the caller waited between two chunks and the
// final usage.
func readResumed(t *testing.T, st *api.Stream, want int, to string, fault func()) (time.Duration, api.Usage) {
	t.Helper()
	var tokens int
	var longest time.Duration
	var usage api.Usage
	last := time.Now()
	for c, err := range st.Chunks() {
		if err != nil {
			t.Fatalf("after %d tokens: %v", tokens, err)
		}
		if gap := time.Since(last); gap > longest && tokens > 0 {
			longest = gap
		}
		last = time.Now()
		if c.HasToken {
			if tokens++; tokens == 10 {
				fault()
			}
		}
		if c.Usage != nil {
			usage = *c.Usage
		}
	}
	if tokens != want || usage.Resumes != 1 || usage.Backend != to {
		t.Fatalf("%d tokens, usage %+v; want %d, resumed once on %s", tokens, usage, want, to)
	}
	return longest, usage
}

package natsbackend_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/retry"
)

// freezer is a TCP proxy in front of a NATS server that can stop
// forwarding without closing either side, as a stopped process or a
// machine cut off the network leaves its connection: the server keeps
// the client's subscriptions until its own ping timeout (minutes).
type freezer struct {
	ln     net.Listener
	target string
	frozen atomic.Bool
	thaw   chan struct{} // closed by close: held bytes are dropped
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, target: target, thaw: make(chan struct{})}
	f.wg.Go(f.accept)
	t.Cleanup(f.close)
	return f
}

func (f *freezer) url() string { return "nats://" + f.ln.Addr().String() }

func (f *freezer) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", f.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		f.mu.Lock()
		f.conns = append(f.conns, c, s)
		f.mu.Unlock()
		f.wg.Go(func() { f.pipe(s, c) })
		f.wg.Go(func() { f.pipe(c, s) })
	}
}

// pipe copies from src to dst until frozen, then holds what it reads.
func (f *freezer) pipe(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if f.frozen.Load() {
			<-f.thaw
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (f *freezer) close() {
	_ = f.ln.Close()
	close(f.thaw)
	f.mu.Lock()
	for _, c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// TestSilentInstanceResumesFast: an instance whose connection goes silent
// without closing (no "no responders" for its probes, no end to its TCP
// connection) is removed once it has left its probes unanswered for the
// probe timeout (200 ms by default), not after the discovery timeout (10 s here) or
// three missed heartbeats (6 s), and its stream that had delivered tokens
// resumes on another instance; a request sent to it meanwhile fails as
// soon as it is found gone (the balancer fails it over).
func TestSilentInstanceResumesFast(t *testing.T) {
	n := startNATS(t)
	f := newFreezer(t, n.ns.Addr().String())
	nc, err := nats.Connect(f.url(), nats.Name("a"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	startInstanceOn(t, "a", nc, enginetest.WithStepTime(5*time.Millisecond, 0))
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
	a := d.Client("a")

	// A request sent to a while it is silent, before discovery found it
	// gone, ends when it is found gone, not after the start timeout.
	type outcome struct {
		err  error
		took time.Duration
	}
	sent := make(chan outcome, 1)
	var frozen time.Time
	longest, usage := readResumed(t, st, 200, "b", func() {
		frozen = time.Now()
		f.frozen.Store(true)
		go func() {
			_, err := a.Generate(context.Background(), genReq(2))
			sent <- outcome{err, time.Since(frozen)}
		}()
	})
	waitInstances(t, d, "b")
	removed := time.Now()
	if o := <-sent; !errors.Is(o.err, natsbackend.ErrInstanceLost) || !retry.Classify(o.err).FailsOver() || o.took > 3*time.Second {
		t.Errorf("a request to the silent instance: %v after %v; want ErrInstanceLost, failing over, once it is found gone", o.err, o.took)
	}
	if longest > 3*time.Second {
		t.Errorf("the caller waited %v between chunks (resume gap %v); want well under the 6 s heartbeat timeout", longest, usage.ResumeGap)
	}
	t.Logf("longest wait between chunks %v, resume gap %v; a was out of the registry %v after the freeze", longest, usage.ResumeGap, removed.Sub(frozen))
}

package natsbackend_test

import (
	"context"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// TestDrainIsLossless: a draining instance is advertised as such, the
// balancer routes new requests elsewhere, and the stream it was serving
// ends with its final chunk and usage, not an error.
func TestDrainIsLossless(t *testing.T) {
	n := startNATS(t)
	a := startInstance(t, n, "a", enginetest.WithStepTime(5*time.Millisecond, 0))
	startInstance(t, n, "b")
	lb, d := newBalancer(t, n)
	waitInstances(t, d, "a", "b")
	st, err := d.Client("a").Generate(context.Background(), genReq(120))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	drained := make(chan error, 1)
	go func() { drained <- a.svc.Drain(context.Background(), 300*time.Millisecond) }()
	waitFor(t, "a advertised as draining", func() bool { return d.Client("a").Load().Draining })
	for range 6 {
		s, err := lb.Generate(context.Background(), genReq(2))
		if err != nil {
			t.Fatal(err)
		}
		if s.Header().Backend != "b" {
			t.Errorf("routed to %q while a drains", s.Header().Backend)
		}
		if _, err := s.Collect(); err != nil {
			t.Fatal(err)
		}
	}
	res, err := st.Collect()
	if err != nil || res.Finish != api.FinishLength || res.Usage.CompletionTokens != 120 {
		t.Fatalf("stream across the drain: %+v, %v; want all 120 tokens and its usage", res.Usage, err)
	}
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
}

// TestDrainKeepsQueuedStreams: once a draining instance leaves discovery
// (its probes find no responders), the requests still queued on it are
// not failed over: it serves them to their end.
func TestDrainKeepsQueuedStreams(t *testing.T) {
	n := startNATS(t)
	a := startInstance(t, n, "a", enginetest.WithStepTime(5*time.Millisecond, 0), enginetest.WithMaxBatch(1))
	startInstance(t, n, "b")
	lb, d := newBalancer(t, n, natsbackend.WithProbeInterval(20*time.Millisecond))
	waitInstances(t, d, "a", "b")
	c := d.Client("a")
	var streams []*api.Stream
	for range 3 { // one generating, two queued behind it (a batch of 1)
		st, err := c.Generate(context.Background(), genReq(60))
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	drained := make(chan error, 1)
	go func() { drained <- a.svc.Drain(context.Background(), 50*time.Millisecond) }()
	for i, st := range streams {
		res, err := st.Collect()
		if err != nil || res.Usage.CompletionTokens != 60 {
			t.Fatalf("stream %d across the drain: %+v, %v; want all 60 tokens", i, res.Usage, err)
		}
	}
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	if f := lb.Stats().Failovers; f != 0 {
		t.Errorf("%d failovers", f)
	}
}

// TestLostMessagesReplayed: chunk messages lost on the way (here the
// second and the final one) are sent again when the client asks, so the
// stream ends whole, with the same text as the Server's own.
func TestLostMessagesReplayed(t *testing.T) {
	n := startNATS(t)
	a := startInstance(t, n, "a", enginetest.WithStepTime(2*time.Millisecond, 0))
	_, d := newBalancer(t, n)
	waitInstances(t, d, "a")
	natsbackend.DropChunkMessagesForTest(a.svc, func(seq uint64, final bool) bool { return seq == 1 || final })
	want, err := mustCollect(a.srv.Generate(context.Background(), genReq(20)))
	if err != nil {
		t.Fatal(err)
	}
	got, err := mustCollect(d.Client("a").Generate(context.Background(), genReq(20)))
	if err != nil || got.Text != want.Text || len(got.Tokens) != 20 || got.Usage.CompletionTokens != 20 {
		t.Fatalf("across lost messages: %q (%d tokens), %v; want %q", got.Text, len(got.Tokens), err, want.Text)
	}
}

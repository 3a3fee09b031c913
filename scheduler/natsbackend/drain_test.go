package natsbackend_test

import (
	"context"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// TestDrainIsLossless: a draining instance is advertised as such, the
// balancer routes new requests elsewhere, and the stream it was serving
// ends with its final chunk and usage, not an error.
func TestDrainIsLossless(t *testing.T) {
	n := startNATS(t)
	a := startInstance(t, n, "a", enginetest.WithStepTime(5*time.Millisecond, 0))
	startInstance(t, n, "b")
	lb, d := balancer(t, n)
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

package natsbackend_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
)

// TestServeRefusesATakenName: a second instance under a live instance's
// name is refused with ErrNameTaken; the name is free again once the
// first stops.
func TestServeRefusesATakenName(t *testing.T) {
	n := startNATS(t)
	a := startInstance(t, n, "a")
	nc := n.connect(t, "second")
	if _, err := natsbackend.Serve(nc, "a", a.srv); !errors.Is(err, natsbackend.ErrNameTaken) {
		t.Fatalf("second Serve under a live name: %v, want ErrNameTaken", err)
	}
	if err := a.svc.Stop(); err != nil {
		t.Fatal(err)
	}
	svc, err := natsbackend.Serve(nc, "a", a.srv)
	if err != nil {
		t.Fatalf("Serve after the first stopped: %v", err)
	}
	_ = svc.Stop()
}

// TestDiscoveryKeepsOneOfTwoSameNamedInstances: when two live services
// answer under one name anyway (one started past Serve's check), discovery
// routes to the newer and does not swap between them.
func TestDiscoveryKeepsOneOfTwoSameNamedInstances(t *testing.T) {
	n := startNATS(t)
	startInstance(t, n, "a")
	_, d := newBalancer(t, n)
	waitInstances(t, d, "a")
	first := d.Client("a")
	nc := n.connect(t, "impostor")
	noop := micro.HandlerFunc(func(r micro.Request) { _ = r.Error("500", "impostor", nil) })
	svc, err := micro.AddService(nc, micro.Config{Name: natsbackend.DefaultService, Version: "1.0.0", Metadata: map[string]string{"instance": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = svc.Stop() }()
	g := svc.AddGroup(natsbackend.DefaultService + "." + svc.Info().ID)
	for _, e := range []string{"generate", "chat", "load"} {
		if err := g.AddEndpoint(e, noop); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the newer instance under the name", func() bool { return d.Client("a") != first })
	newer := d.Client("a")
	time.Sleep(300 * time.Millisecond) // six discovery intervals: both answer every one
	if got := d.Client("a"); got != newer {
		t.Fatal("discovery swapped the two instances under one name")
	}
}

// TestNoRespondersRemovesAtOnce: once a request finds no responders on an
// instance (its process died), discovery has dropped it - not after its
// timeout (10 s here) - and the balancer routes to the rest. Probes are
// off, so the request is what finds it gone.
func TestNoRespondersRemovesAtOnce(t *testing.T) {
	n := startNATS(t)
	a := startInstance(t, n, "a")
	startInstance(t, n, "b")
	lb, d := newBalancer(t, n, natsbackend.WithTimeout(10*time.Second), natsbackend.WithProbeInterval(time.Hour))
	waitInstances(t, d, "a", "b")
	c := d.Client("a")
	a.nc.Close() // as kill -9 leaves it: no goodbye
	// Until the NATS server has dropped a's subscriptions a request may
	// still reach them (and time out); then it finds no responders.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, err := c.Generate(ctx, genReq(2))
		cancel()
		if errors.Is(err, nats.ErrNoResponders) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no no-responders error from the dead instance: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := d.Instances(); len(got) != 1 || got[0] != "b" {
		t.Fatalf("instances right after a no-responders error: %v, want [b]", got)
	}
	st, err := lb.Generate(context.Background(), genReq(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Collect(); err != nil || st.Header().Backend != "b" {
		t.Fatalf("after the removal: %v on %q", err, st.Header().Backend)
	}
}

// TestSharedOptionsCheckedOnBothSides: an Option is one value for Serve
// and Discover, and each refuses its bad values; nil options are skipped.
func TestSharedOptionsCheckedOnBothSides(t *testing.T) {
	n := startNATS(t)
	a := startInstance(t, n, "a")
	nc := n.connect(t, "options")
	lb, err := balancer.New()
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	for name, o := range map[string]natsbackend.Option{
		"heartbeat 0":  natsbackend.WithHeartbeat(0),
		"service a.b":  natsbackend.WithService("a.b"),
		"logger nil":   natsbackend.WithLogger(nil),
		"heartbeat -1": natsbackend.WithHeartbeat(-time.Second),
	} {
		if svc, err := natsbackend.Serve(nc, "b", a.srv, o); err == nil {
			svc.Stop()
			t.Errorf("Serve with %s: no error", name)
		}
		if d, err := natsbackend.Discover(context.Background(), nc, lb, o); err == nil {
			d.Close()
			t.Errorf("Discover with %s: no error", name)
		}
	}
	if _, err := natsbackend.Discover(context.Background(), nc, lb, natsbackend.WithCreditWindow(1)); err == nil {
		t.Error("Discover with a credit window of 1: no error")
	}
	d, err := natsbackend.Discover(context.Background(), nc, lb, nil, natsbackend.Option{}, natsbackend.WithHeartbeat(time.Second))
	if err != nil {
		t.Fatalf("Discover with nil and zero options: %v", err)
	}
	d.Close()
}

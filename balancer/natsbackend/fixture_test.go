package natsbackend_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/testmodel"
)

// natsServer is an embedded nats-server on a random loopback port, which
// a test can stop and start again on the same port.
type natsServer struct {
	t    testing.TB
	port int
	ns   *server.Server
	opts func(*server.Options) // nil: the defaults
}

func startNATS(t testing.TB) *natsServer {
	t.Helper()
	return startNATSWith(t, nil)
}

// startNATSWith is startNATS with the server's options changed by opts.
func startNATSWith(t testing.TB, opts func(*server.Options)) *natsServer {
	t.Helper()
	n := &natsServer{t: t, port: -1, opts: opts}
	n.start()
	t.Cleanup(n.stop)
	return n
}

func (n *natsServer) start() {
	n.t.Helper()
	o := &server.Options{Host: "127.0.0.1", Port: n.port, NoLog: true, NoSigs: true}
	if n.opts != nil {
		n.opts(o)
	}
	ns, err := server.NewServer(o)
	if err != nil {
		n.t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		n.t.Fatal("nats-server not ready")
	}
	n.ns = ns
	n.port = ns.Addr().(*net.TCPAddr).Port
}

func (n *natsServer) stop() {
	if n.ns != nil {
		n.ns.Shutdown()
		n.ns.WaitForShutdown()
		n.ns = nil
	}
}

func (n *natsServer) url() string { return n.ns.ClientURL() }

func (n *natsServer) connect(t testing.TB, name string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(n.url(), nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// instance is a real Server on the simulated engine (enginetest.Sim) with
// the test checkpoint, served over NATS under name.
type instance struct {
	name string
	sim  *enginetest.Sim
	srv  *mlxserving.Server
	nc   *nats.Conn
	svc  *natsbackend.Service
}

func startInstance(t testing.TB, n *natsServer, name string, simOpts ...enginetest.SimOption) *instance {
	t.Helper()
	return startInstanceOn(t, name, n.connect(t, name), simOpts...)
}

// startInstanceOn is startInstance on a connection of the caller's.
func startInstanceOn(t testing.TB, name string, nc *nats.Conn, simOpts ...enginetest.SimOption) *instance {
	t.Helper()
	return startServerOn(t, name, nc, nil, simOpts...)
}

// startServerOn is startInstanceOn with the Server's options.
func startServerOn(t testing.TB, name string, nc *nats.Conn, srvOpts []mlxserving.Option, simOpts ...enginetest.SimOption) *instance {
	t.Helper()
	dir := t.TempDir()
	cfg := testmodel.Tiny()
	if err := testmodel.Write(dir, cfg); err != nil {
		t.Fatal(err)
	}
	sim, err := enginetest.NewSim(append([]enginetest.SimOption{enginetest.WithVocabSize(cfg.Vocab), enginetest.WithContextLength(cfg.ContextLength)}, simOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := mlxserving.New(sim, srvOpts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir}); err != nil {
		t.Fatal(err)
	}
	in := &instance{name: name, sim: sim, srv: srv, nc: nc}
	in.svc, err = natsbackend.Serve(in.nc, name, srv, natsbackend.WithHeartbeat(testHeartbeat))
	if err != nil {
		t.Fatal(err)
	}
	if err := in.nc.Flush(); err != nil { // the service's subscriptions reached the server
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = in.svc.Stop()
		in.nc.Close()
		_ = srv.Close()
		_ = sim.Close()
	})
	return in
}

// newBalancer is a LoadBalancer kept in step with the instances by Discover.
func newBalancer(t testing.TB, n *natsServer, opts ...natsbackend.DiscoverOption) (*balancer.LoadBalancer, *natsbackend.Discovery) {
	t.Helper()
	lb, err := balancer.New(balancer.WithStrategy(balancer.RoundRobin()))
	if err != nil {
		t.Fatal(err)
	}
	nc := n.connect(t, "balancer")
	opts = append([]natsbackend.DiscoverOption{natsbackend.WithInterval(50 * time.Millisecond), natsbackend.WithTimeout(500 * time.Millisecond),
		natsbackend.WithHeartbeat(testHeartbeat)}, opts...)
	d, err := natsbackend.Discover(context.Background(), nc, lb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.Close()
		_ = lb.Close()
	})
	return lb, d
}

func waitInstances(t testing.TB, d *natsbackend.Discovery, names ...string) {
	t.Helper()
	slices.Sort(names)
	waitFor(t, fmt.Sprint("instances ", names), func() bool {
		got := d.Instances()
		slices.Sort(got)
		return slices.Equal(got, names)
	})
}

// waitFor polls cond until it holds or a few seconds pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// testHeartbeat is the instances' heartbeat in tests: short, so a lost
// instance is noticed quickly, yet 3 of them (the client's limit) outlast
// the stalls of a loaded 2-core machine.
var testHeartbeat = 100 * time.Millisecond

package natsbackend_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/internal/natstest"
)

// TestPermissions runs testdata/nats-server.conf: instances and gateways
// work under their users; a client with a wrong password cannot connect,
// and another application's user can neither register an instance nor
// call one.
func TestPermissions(t *testing.T) {
	url := natstest.Start(t, "testdata/nats-server.conf")
	connect := func(user, pass string) (*nats.Conn, error) {
		nc, err := nats.Connect(url, nats.UserInfo(user, pass), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err == nil {
			t.Cleanup(nc.Close)
		}
		return nc, err
	}
	if _, err := connect("gateway", "wrong"); err == nil {
		t.Fatal("a wrong password connected")
	}

	inst := startInstanceOn(t, "a", func() *nats.Conn {
		nc, err := connect("instance", "instance-secret")
		if err != nil {
			t.Fatal(err)
		}
		return nc
	}())
	gw, err := connect("gateway", "gateway-secret")
	if err != nil {
		t.Fatal(err)
	}
	lb, err := balancer.New()
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	d, err := natsbackend.Discover(context.Background(), gw, lb, natsbackend.WithInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	waitInstances(t, d, "a")
	st, err := lb.Generate(context.Background(), genReq(3))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := st.Collect(); err != nil || res.Usage.CompletionTokens != 3 {
		t.Fatalf("through the gateway user: %+v, %v", res, err)
	}

	other, err := connect("other", "other-secret")
	if err != nil {
		t.Fatal(err)
	}
	// Cannot register: its service is never discovered.
	if svc, err := natsbackend.Serve(other, "evil", inst.srv); err == nil {
		defer svc.Stop()
	}
	time.Sleep(300 * time.Millisecond) // six discovery rounds
	if got := d.Instances(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("instances with another application's user serving: %v", got)
	}
	// Cannot call: a request to the instance's endpoint gets no answer.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	msg := nats.NewMsg("mlxserving." + inst.svc.ID() + ".generate")
	msg.Header.Set("Mlx-Stream", other.NewInbox())
	msg.Header.Set("Mlx-Window", "8")
	msg.Data = []byte(`{"model":"tiny","prompt":"x","max_tokens":1}`)
	if reply, err := other.RequestMsgWithContext(ctx, msg); err == nil {
		t.Fatalf("another application's user called the instance: %s", reply.Data)
	}
}

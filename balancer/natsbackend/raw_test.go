package natsbackend_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// endpoint finds an instance's endpoint subject through micro's INFO.
func endpoint(t *testing.T, nc *nats.Conn, name string) string {
	t.Helper()
	var m *nats.Msg
	waitFor(t, "an instance answering INFO", func() bool {
		var err error
		m, err = nc.Request("$SRV.INFO.mlxserving", nil, time.Second)
		return err == nil
	})
	var info micro.Info
	if err := json.Unmarshal(m.Data, &info); err != nil {
		t.Fatal(err)
	}
	for _, e := range info.Endpoints {
		if e.Name == name {
			return e.Subject
		}
	}
	t.Fatalf("no endpoint %s in %s", name, m.Data)
	return ""
}

// TestBadRequests: malformed requests get a typed error reply and the
// instance keeps serving.
func TestBadRequests(t *testing.T) {
	n := startNATS(t)
	startInstance(t, n, "a")
	nc := n.connect(t, "raw")
	subj := endpoint(t, nc, "generate")
	for _, tc := range []struct {
		name   string
		data   string
		header bool
	}{
		{"no stream headers", `{"Model":"tiny","Prompt":"x","MaxTokens":2}`, false},
		{"not json", `{{{`, true},
		{"wrong types", `{"Model":5}`, true},
	} {
		msg := nats.NewMsg(subj)
		msg.Data = []byte(tc.data)
		if tc.header {
			msg.Header.Set("Mlx-Stream", nc.NewInbox())
			msg.Header.Set("Mlx-Window", "4")
		}
		reply, err := nc.RequestMsg(msg, 2*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if reply.Header.Get("Mlx-Kind") != "error" || !strings.Contains(string(reply.Data), `"code":"invalid_value"`) {
			t.Errorf("%s: reply %v %s", tc.name, reply.Header, reply.Data)
		}
	}
	// Still serving.
	lbs, d := newBalancer(t, n)
	waitInstances(t, d, "a")
	if res, err := mustCollect(lbs.Generate(t.Context(), genReq(3))); err != nil || res.Usage.CompletionTokens != 3 {
		t.Fatalf("after bad requests: %+v %v", res, err)
	}
}

// TestStalledClient: a client that stops granting credit (gone without a
// cancel) has its generation stopped after the stall timeout.
func TestStalledClient(t *testing.T) {
	n := startNATS(t)
	a := startInstance(t, n, "a", enginetest.WithStepTime(time.Millisecond, 0))
	_ = a.svc.Stop()
	svc, err := natsbackend.Serve(a.nc, "a2", a.srv, natsbackend.WithStallTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()
	nc := n.connect(t, "raw")
	subj := endpoint(t, nc, "generate")
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	msg := nats.NewMsg(subj)
	msg.Data = []byte(`{"Model":"tiny","Prompt":"hello","MaxTokens":400,"IgnoreEOS":true}`)
	msg.Header.Set("Mlx-Stream", inbox)
	msg.Header.Set("Mlx-Window", "2")
	reply, err := nc.RequestMsg(msg, 2*time.Second)
	if err != nil || reply.Header.Get("Mlx-Kind") != "start" {
		t.Fatalf("start: %v %v", reply, err)
	}
	waitFor(t, "generation running", func() bool { return a.sim.Stats().OpenSequences == 1 })
	waitFor(t, "stalled generation stopped", func() bool { return a.sim.Stats().OpenSequences == 0 })
	chunks := 0
	for {
		m, err := sub.NextMsg(50 * time.Millisecond)
		if err != nil {
			break
		}
		if m.Data[0] == 'c' { // 'c', the message's number, the chunks
			var batch []json.RawMessage
			_ = json.Unmarshal(m.Data[bytes.IndexByte(m.Data, '['):], &batch)
			chunks += len(batch)
		}
	}
	if chunks != 2 {
		t.Errorf("the instance sent %d chunks on a window of 2", chunks)
	}
}

// TestInstanceRestart: an instance that comes back under the same name
// with a new service replaces the old one in the registry at once.
func TestInstanceRestart(t *testing.T) {
	n := startNATS(t)
	a := startInstance(t, n, "a")
	lb, d := newBalancer(t, n, natsbackend.WithTimeout(time.Minute))
	waitInstances(t, d, "a")
	old := d.Client("a")
	_ = a.svc.Stop()
	svc, err := natsbackend.Serve(a.nc, "a", a.srv)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()
	waitFor(t, "new client for a", func() bool { c := d.Client("a"); return c != nil && c != old })
	if got := d.Instances(); len(got) != 1 {
		t.Fatalf("instances %v", got)
	}
	if res, err := mustCollect(lb.Generate(t.Context(), genReq(3))); err != nil || res.Usage.CompletionTokens != 3 {
		t.Fatalf("after restart: %+v %v", res, err)
	}
}

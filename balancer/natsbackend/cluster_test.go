package natsbackend_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/internal/natstest"
	"github.com/mlxserving/mlxserving/retry"
)

// TestClusterNodeLoss: three instances and a balancer on a 3-node NATS
// cluster, each client given every node's URL. Under load, the node of
// one instance is shut down, then the node of another instance and of the
// balancer: no request fails before its first token, and no stream is
// cut or silently misses a token (chunk messages lost with a node are
// sent again).
func TestClusterNodeLoss(t *testing.T) {
	cl := natstest.StartCluster(t, 3)
	connect := func(name string, node int) *nats.Conn {
		nc, err := nats.Connect(cl.URLs(node), nats.Name(name), nats.DontRandomize(), nats.MaxReconnects(-1),
			nats.ReconnectWait(50*time.Millisecond), nats.ReconnectJitter(0, 0))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	for i, name := range []string{"a", "b", "c"} {
		startInstanceOn(t, name, connect(name, i), enginetest.WithStepTime(5*time.Millisecond, 0))
	}
	lb, err := balancer.New(balancer.WithStrategy(balancer.LeastLoaded()))
	if err != nil {
		t.Fatal(err)
	}
	d, err := natsbackend.Discover(context.Background(), connect("balancer", 0), lb, natsbackend.WithInterval(50*time.Millisecond),
		natsbackend.WithTimeout(500*time.Millisecond), natsbackend.WithHeartbeat(testHeartbeat), natsbackend.WithStartTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close(); _ = lb.Close() })
	waitInstances(t, d, "a", "b", "c")

	var ok, interrupted atomic.Int64
	var mu sync.Mutex
	var failed []string
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 12 {
		wg.Go(func() {
			for ctx.Err() == nil {
				st, err := lb.Generate(context.Background(), genReq(24))
				var res api.Result
				if err == nil {
					res, err = st.Collect()
				}
				if err == nil && len(res.Tokens) != res.Usage.CompletionTokens {
					err = fmt.Errorf("a stream lost tokens silently: %d of %d arrived", len(res.Tokens), res.Usage.CompletionTokens)
				}
				var ie *retry.InterruptedError
				switch {
				case err == nil:
					ok.Add(1)
				case errors.As(err, &ie):
					interrupted.Add(1)
				default:
					mu.Lock()
					failed = append(failed, err.Error())
					mu.Unlock()
				}
			}
		})
	}
	time.Sleep(500 * time.Millisecond)
	cl.Stop(1) // instance b's node
	time.Sleep(700 * time.Millisecond)
	cl.Stop(0) // instance a's and the balancer's node
	time.Sleep(700 * time.Millisecond)
	stop()
	wg.Wait()
	t.Logf("%d completed, %d interrupted mid-stream, %d failed before the first token", ok.Load(), interrupted.Load(), len(failed))
	if len(failed) > 0 {
		t.Errorf("%d requests failed before their first token, first: %s", len(failed), failed[0])
	}
	if n := interrupted.Load(); n > 0 {
		t.Errorf("%d streams interrupted", n)
	}
	if ok.Load() == 0 {
		t.Error("no request completed")
	}
	waitInstances(t, d, "a", "b", "c") // all moved to the last node
	if res, err := mustCollect(lb.Generate(context.Background(), genReq(3))); err != nil || res.Usage.CompletionTokens != 3 {
		t.Fatalf("after the losses: %+v %v", res, err)
	}
}

package redisaffinity_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/redisaffinity"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/testmodel"
)

// servers starts n Servers on the simulated engine (enginetest.Sim) with
// the test checkpoint.
func servers(t testing.TB, n int, simOpts ...enginetest.SimOption) []*mlxserving.Server {
	dir := t.TempDir()
	cfg := testmodel.Tiny()
	if err := testmodel.Write(dir, cfg); err != nil {
		t.Fatal(err)
	}
	var out []*mlxserving.Server
	for range n {
		sim, err := enginetest.NewSim(append([]enginetest.SimOption{enginetest.WithVocabSize(cfg.Vocab), enginetest.WithContextLength(cfg.ContextLength)}, simOpts...)...)
		if err != nil {
			t.Fatal(err)
		}
		srv, err := mlxserving.New(sim)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = srv.Close()
			_ = sim.Close()
		})
		if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir}); err != nil {
			t.Fatal(err)
		}
		out = append(out, srv)
	}
	return out
}

// TestReplicasShareSessions: two balancer replicas over the same three
// instances, each round-robin on its own, send every turn of a session to
// the instance the first turn went to, because they share the Redis
// store; with Redis down they keep serving (routing locally) and share
// again once it is back.
func TestReplicasShareSessions(t *testing.T) {
	r := startRedis(t)
	rdb := client(t, r)
	store, err := redisaffinity.New(rdb, redisaffinity.WithPrefix("test:"))
	if err != nil {
		t.Fatal(err)
	}
	srvs := servers(t, 3)
	var lbs []*balancer.LoadBalancer
	for range 2 {
		lb, err := balancer.New(balancer.WithStrategy(balancer.RoundRobin()), balancer.WithAffinityStore(store, time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lb.Close() })
		for i, s := range srvs {
			if err := lb.Add(fmt.Sprintf("n%d", i+1), s); err != nil {
				t.Fatal(err)
			}
		}
		lbs = append(lbs, lb)
	}
	turn := func(lb *balancer.LoadBalancer, session string) (string, error) {
		st, err := lb.Generate(context.Background(), api.Request{Model: "tiny", Prompt: "hello " + session,
			Params: api.Params{MaxTokens: 2, IgnoreEOS: true, Session: session}})
		if err != nil {
			return "", err
		}
		_, err = st.Collect()
		return st.Header().Backend, err
	}
	for s := range 4 {
		session := fmt.Sprint("conv-", s)
		home, err := turn(lbs[0], session)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			got, err := turn(lbs[i%2], session)
			if err != nil {
				t.Fatal(err)
			}
			if got != home {
				t.Errorf("%s: turn %d on replica %d went to %s, home %s", session, i+2, i%2, got, home)
			}
		}
	}
	r.stop()
	for i := range 3 {
		if _, err := turn(lbs[i%2], "conv-0"); err != nil {
			t.Fatalf("Redis down: %v, want local routing", err)
		}
	}
	r.start()
	waitUp := time.Now().Add(5 * time.Second)
	for store.Set(context.Background(), "probe", "x", time.Second) != nil {
		if time.Now().After(waitUp) {
			t.Fatal("Redis did not come back")
		}
		time.Sleep(50 * time.Millisecond)
	}
	home, err := turn(lbs[0], "conv-new")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if got, _ := turn(lbs[1], "conv-new"); got != home {
			t.Errorf("after restart: turn %d went to %s, home %s", i, got, home)
		}
	}
}

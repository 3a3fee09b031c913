package redisaffinity_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/mlxserving/mlxserving/balancer/redisaffinity"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// redisServer is a real redis-server on a loopback port, without
// persistence, stopped at the end of the test.
type redisServer struct {
	t    testing.TB
	bin  string
	port int
	cmd  *exec.Cmd
}

func startRedis(t testing.TB) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redis-server not found (scripts/setup.d/50-redis.sh installs it): %v", err)
		}
		t.Skip("redis-server not installed (apt-get install redis-server, or scripts/setup.d/50-redis.sh); skipping")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	r := &redisServer{t: t, bin: bin, port: port}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *redisServer) addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }

func (r *redisServer) start() {
	r.t.Helper()
	r.cmd = exec.Command(r.bin, "--port", fmt.Sprint(r.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	r.cmd.Dir = r.t.TempDir()
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", r.addr(), 100*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("redis-server did not listen on %s", r.addr())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *redisServer) stop() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}

func client(t testing.TB, r *redisServer) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: r.addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func TestStoreGetSetTTL(t *testing.T) {
	r := startRedis(t)
	rdb := client(t, r)
	ctx := context.Background()
	a, err := redisaffinity.New(rdb, redisaffinity.WithPrefix("a:"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := redisaffinity.New(rdb, redisaffinity.WithPrefix("b:"))
	if got, err := a.Get(ctx, "s1"); err != nil || got != "" {
		t.Fatalf("empty store: %q %v", got, err)
	}
	if err := a.Set(ctx, "s1", "node-2", 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Get(ctx, "s1"); err != nil || got != "node-2" {
		t.Fatalf("get: %q %v", got, err)
	}
	if got, _ := b.Get(ctx, "s1"); got != "" {
		t.Errorf("prefix b sees a's key: %q", got)
	}
	if keys, _ := rdb.Keys(ctx, "a:affinity:s1").Result(); len(keys) != 1 {
		t.Errorf("keys %v", keys)
	}
	time.Sleep(300 * time.Millisecond)
	if got, err := a.Get(ctx, "s1"); err != nil || got != "" {
		t.Errorf("after TTL: %q %v", got, err)
	}
	if err := a.Set(ctx, "s1", "x", 0); err == nil {
		t.Error("zero TTL accepted")
	}
	if _, err := redisaffinity.New(nil); err == nil {
		t.Error("nil client accepted")
	}
	if _, err := redisaffinity.New(rdb, redisaffinity.WithPrefix("")); err == nil {
		t.Error("empty prefix accepted")
	}
}

func TestResponseCache(t *testing.T) {
	r := startRedis(t)
	rdb := client(t, r)
	ctx := context.Background()
	c, err := redisaffinity.NewResponseCache(rdb, redisaffinity.WithMaxValueBytes(16))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := c.Get(ctx, "k"); ok || err != nil {
		t.Fatalf("empty: %v %v", ok, err)
	}
	if err := c.Set(ctx, "k", []byte("hello\x00world"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := c.Get(ctx, "k"); !ok || err != nil || string(v) != "hello\x00world" {
		t.Fatalf("get: %q %v %v", v, ok, err)
	}
	err = c.Set(ctx, "big", []byte(strings.Repeat("x", 17)), time.Minute)
	var tl *redisaffinity.ValueTooLargeError
	if !errors.As(err, &tl) || tl.Size != 17 || tl.Max != 16 {
		t.Errorf("oversized value: %v", err)
	}
	if _, ok, _ := c.Get(ctx, "big"); ok {
		t.Error("oversized value stored")
	}
}

// TestRedisRestart: while Redis is down every call fails (fast, with an
// error); once it is back the same Store works again.
func TestRedisRestart(t *testing.T) {
	r := startRedis(t)
	rdb := client(t, r)
	ctx := context.Background()
	s, err := redisaffinity.New(rdb, redisaffinity.WithTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := redisaffinity.NewResponseCache(rdb)
	if err := s.Set(ctx, "s1", "node-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	r.stop()
	start := time.Now()
	if _, err := s.Get(ctx, "s1"); err == nil {
		t.Fatal("Get with Redis down succeeded")
	}
	if err := s.Set(ctx, "s1", "node-3", time.Minute); err == nil {
		t.Fatal("Set with Redis down succeeded")
	}
	if _, _, err := c.Get(ctx, "k"); err == nil {
		t.Fatal("cache Get with Redis down succeeded")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("calls with Redis down took %v", d)
	}
	r.start() // empty: no persistence
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := s.Set(ctx, "s1", "node-3", time.Minute)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("store did not recover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got, err := s.Get(ctx, "s1"); err != nil || got != "node-3" {
		t.Fatalf("after restart: %q %v", got, err)
	}
}

package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startRedis runs Debian's redis-server on a loopback port until the
// test ends, and returns its address.
func startRedis(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redis-server not found (scripts/setup.d/50-redis.sh installs it): %v", err)
		}
		t.Skip("redis-server not installed; skipping")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	cmd.Dir = t.TempDir()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			_ = c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not listen on %s", addr)
		}
	}
}

// TestRedisPrefix: with -redis-prefix the gateway keeps its session homes
// under that prefix only, so several clusters share one Redis.
func TestRedisPrefix(t *testing.T) {
	raddr := startRedis(t)
	url := withInstance(t)
	addr, stop := startGateway(t, "-nats", url, "-nats-user", "gateway", "-strategy", "session", "-redis", raddr, "-redis-prefix", "blue:")
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	body := `{"model":"tiny","max_tokens":2,"session_id":"s1","messages":[{"role":"user","content":"hi"}]}`
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, b := call(t, client, http.MethodPost, "http://"+addr+"/v1/chat/completions", "", body)
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("through the gateway: %d %s", code, b)
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: raddr})
	defer rdb.Close()
	var keys []string
	var err error
	for deadline := time.Now().Add(5 * time.Second); len(keys) == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if keys, err = rdb.Keys(context.Background(), "*").Result(); err != nil {
			t.Fatal(err)
		}
	}
	if len(keys) == 0 {
		t.Fatal("no session home in Redis")
	}
	for _, k := range keys {
		if len(k) < 5 || k[:5] != "blue:" {
			t.Errorf("key %q outside the prefix blue:", k)
		}
	}
	t.Logf("keys: %q", keys)
	stop()
}

package main

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/internal/syncbuf"
	"github.com/mlxserving/mlxserving/openai"
)

// start runs the example with args until the test ends; it returns the
// base URL.
func start(t *testing.T, args []string, log *syncbuf.Buffer) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	listening := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, log, listening) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	select {
	case addr := <-listening:
		_, port, _ := strings.Cut(addr, "]:")
		if port != "" { // [::]:port
			addr = "127.0.0.1:" + port
		}
		return "http://" + strings.Replace(addr, "0.0.0.0", "127.0.0.1", 1)
	case err := <-done:
		done <- err
		t.Fatalf("server exited: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("server did not start")
	}
	return ""
}

func status(t *testing.T, method, url, key string) int {
	t.Helper()
	var body *strings.Reader
	if method == http.MethodPost {
		body = strings.NewReader(`{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
	} else {
		body = strings.NewReader("")
	}
	req, _ := http.NewRequest(method, url, body)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestAPIKeysFlag(t *testing.T) {
	file := filepath.Join(t.TempDir(), "keys.json")
	if err := os.WriteFile(file, []byte(`{"keys":[{"name":"app","key":"sk-app-0123456789"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(keysEnv, "ops:sk-ops-0123456789")
	var log syncbuf.Buffer
	base := start(t, []string{"-addr", "127.0.0.1:0", "-engine", "sim", "-api-keys", file}, &log)
	cases := []struct {
		method, path, key string
		want              int
	}{
		{http.MethodGet, "/health", "", 200},
		{http.MethodPost, "/v1/chat/completions", "", 401},
		{http.MethodPost, "/v1/chat/completions", "sk-app-0123456789", 200},
		{http.MethodGet, "/metrics", "sk-app-0123456789", 403},
		{http.MethodGet, "/metrics", "sk-ops-0123456789", 200},
	}
	for _, c := range cases {
		if got := status(t, c.method, base+c.path, c.key); got != c.want {
			t.Errorf("%s %s key %q: %d, want %d", c.method, c.path, c.key, got, c.want)
		}
	}
	logs := log.String()
	for _, secret := range []string{"sk-app-0123456789", "sk-ops-0123456789"} {
		if strings.Contains(logs, secret) {
			t.Errorf("the log holds a key:\n%s", logs)
		}
	}
	for _, want := range []string{"API keys required", "engine=sim", "RANDOM weights"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log lacks %q:\n%s", want, logs)
		}
	}
}

func TestWarnsWhenExposedWithoutKeys(t *testing.T) {
	var log syncbuf.Buffer
	base := start(t, []string{"-addr", "0.0.0.0:0", "-engine", "sim"}, &log)
	if got := status(t, http.MethodGet, base+"/v1/models", ""); got != 200 {
		t.Fatalf("no keys: /v1/models %d", got)
	}
	if !strings.Contains(log.String(), "WITHOUT API keys") {
		t.Errorf("no warning for a non-loopback address without keys:\n%s", log.String())
	}
	var quiet syncbuf.Buffer
	start(t, []string{"-addr", "127.0.0.1:0", "-engine", "sim"}, &quiet)
	if strings.Contains(quiet.String(), "WITHOUT API keys") {
		t.Errorf("warned on loopback:\n%s", quiet.String())
	}
}

func TestBadKeyFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "keys.json")
	os.WriteFile(file, []byte(`{"keys":[{"name":"app"}]}`), 0o600)
	err := run(context.Background(), []string{"-addr", "127.0.0.1:0", "-engine", "sim", "-api-keys", file}, &syncbuf.Buffer{}, nil)
	if !errors.Is(err, openai.ErrBadKeys) {
		t.Fatalf("run with a bad key file: %v", err)
	}
}

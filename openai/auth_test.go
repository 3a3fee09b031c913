package openai_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/openai"
	"github.com/mlxserving/mlxserving/scheduler"
)

const (
	adminKey  = "sk-admin-0123456789"
	normalKey = "sk-normal-0123456789"
	otherKey  = "sk-other-0123456789"
)

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func keyedFixture(t *testing.T, extra ...openai.Key) *fixture {
	keys := append([]openai.Key{
		{Name: "ops", SHA256: sha(adminKey), MaxTier: "critical", Admin: true},
		{Name: "app", Secret: normalKey}, // max tier: normal
		{Name: "other", Secret: otherKey, Models: []string{"elsewhere"}},
	}, extra...)
	return newFixture(t, fixtureOpts{handler: []openai.Option{
		openai.WithAPIKeys(keys...),
		openai.WithMetricsHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("metrics\n")) })),
		openai.WithTraceHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("{}\n")) })),
	}})
}

func bearer(key string) []string { return []string{"Authorization", "Bearer " + key} }

const keyChatBody = `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`

func errCode(t *testing.T, body []byte) string {
	t.Helper()
	e, _ := mustJSON(t, body)["error"].(map[string]any)
	code, _ := e["code"].(string)
	if e == nil || e["message"] == "" || e["type"] == "" {
		t.Fatalf("body %s is not an OpenAI error", body)
	}
	return code
}

func TestAPIKeyRequired(t *testing.T) {
	f := keyedFixture(t, openai.Key{Name: "batch", Secret: "sk-low-0123456789", MaxTier: "low"})
	cases := []struct {
		name   string
		header []string
		status int
		code   string
	}{
		{"no key", nil, 401, "invalid_api_key"},
		{"wrong key", bearer("sk-wrong-0123456789"), 401, "invalid_api_key"},
		{"basic scheme", []string{"Authorization", "Basic " + normalKey}, 401, "invalid_api_key"},
		{"key of another name's hash", bearer(sha(normalKey)), 401, "invalid_api_key"},
		{"good key", bearer(normalKey), 200, ""},
		{"lowercase scheme", []string{"Authorization", "bearer " + normalKey}, 200, ""},
		{"tier above the key's", append(bearer(normalKey), "X-Priority", "critical"), 403, "tier_not_allowed"},
		{"tier below the key's", append(bearer(normalKey), "X-Priority", "low"), 200, ""},
		{"admin may use critical", append(bearer(adminKey), "X-Priority", "critical"), 200, ""},
		{"model not allowed", bearer(otherKey), 403, "model_not_allowed"},
		{"no tier: the key's highest below normal", bearer("sk-low-0123456789"), 200, ""},
		{"named tier above a low key", append(bearer("sk-low-0123456789"), "X-Priority", "normal"), 403, "tier_not_allowed"},
	}
	// keep_alive holds memory for every tenant: admin keys only.
	keep := `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"keep_alive":"-1s"}`
	if status, _, body := f.post(t, "/v1/chat/completions", keep, bearer(normalKey)...); status != 403 || errCode(t, body) != "admin_required" {
		t.Errorf("keep_alive from a user key: %d %s", status, body)
	}
	if status, _, body := f.post(t, "/v1/chat/completions", keep, bearer(adminKey)...); status != 200 {
		t.Errorf("keep_alive from an admin key: %d %s", status, body)
	}
	for _, c := range cases {
		status, h, body := f.post(t, "/v1/chat/completions", keyChatBody, c.header...)
		if status != c.status {
			t.Errorf("%s: status %d, want %d: %s", c.name, status, c.status, body)
			continue
		}
		if c.code != "" {
			if got := errCode(t, body); got != c.code {
				t.Errorf("%s: code %q, want %q", c.name, got, c.code)
			}
		}
		if status == 401 && h.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: 401 without WWW-Authenticate", c.name)
		}
	}
}

func TestAPIKeyRoutes(t *testing.T) {
	f := keyedFixture(t)
	get := func(path, key string) int {
		req, _ := http.NewRequest(http.MethodGet, f.ts.URL+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := f.ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	cases := []struct {
		path, key string
		status    int
	}{
		{"/health", "", 200},
		{"/ready", "", 200},
		{"/v1/models", "", 401},
		{"/v1/models", normalKey, 200},
		{"/v1/models/tiny", normalKey, 200},
		{"/v1/models/tiny", otherKey, 404},
		{"/metrics", "", 401},
		{"/metrics", normalKey, 403},
		{"/metrics", adminKey, 200},
	}
	for _, c := range cases {
		if got := get(c.path, c.key); got != c.status {
			t.Errorf("GET %s with key %q: %d, want %d", c.path, c.key, got, c.status)
		}
	}
	// A device trace stalls the engine: admin keys only, as /metrics.
	for key, want := range map[string]int{"": 401, normalKey: 403, adminKey: 200} {
		var h []string
		if key != "" {
			h = bearer(key)
		}
		if status, _, body := f.post(t, "/debug/trace", "", h...); status != want {
			t.Errorf("POST /debug/trace with key %q: %d %s, want %d", key, status, body, want)
		}
	}
}

func TestAPIKeyRequestRate(t *testing.T) {
	f := keyedFixture(t, openai.Key{Name: "slow", Secret: "sk-slow-0123456789", RequestsPerMinute: 2},
		openai.Key{Name: "fast", Secret: "sk-fast-0123456789"})
	for i := range 2 {
		if status, _, body := f.post(t, "/v1/chat/completions", keyChatBody, bearer("sk-slow-0123456789")...); status != 200 {
			t.Fatalf("request %d: %d %s", i, status, body)
		}
	}
	status, h, body := f.post(t, "/v1/chat/completions", keyChatBody, bearer("sk-slow-0123456789")...)
	if status != 429 || errCode(t, body) != "rate_limit_exceeded" {
		t.Fatalf("third request: %d %s", status, body)
	}
	if s, err := strconv.Atoi(h.Get("Retry-After")); err != nil || s < 1 || s > 30 {
		t.Errorf("Retry-After %q: want 1..30 s (one request refills in 30 s)", h.Get("Retry-After"))
	}
	// Limits are per key: another key is not affected.
	if status, _, body := f.post(t, "/v1/chat/completions", keyChatBody, bearer("sk-fast-0123456789")...); status != 200 {
		t.Fatalf("other key: %d %s", status, body)
	}
}

func TestAPIKeyTokenRate(t *testing.T) {
	f := keyedFixture(t, openai.Key{Name: "tok", Secret: "sk-tok-0123456789", TokensPerMinute: 40})
	body := `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":30,"ignore_eos":true}`
	status, _, out := f.post(t, "/v1/chat/completions", body, bearer("sk-tok-0123456789")...)
	if status != 200 {
		t.Fatalf("first: %d %s", status, out)
	}
	usage := mustJSON(t, out)["usage"].(map[string]any)
	if total := usage["total_tokens"].(float64); total <= 40 {
		t.Fatalf("usage %v: the test needs one request above the 40-token minute", usage)
	}
	status, h, out := f.post(t, "/v1/chat/completions", body, bearer("sk-tok-0123456789")...)
	if status != 429 || !strings.Contains(string(out), "tokens per minute") || h.Get("Retry-After") == "" {
		t.Fatalf("second: %d %s (Retry-After %q)", status, out, h.Get("Retry-After"))
	}
}

func TestAPIKeysAreTheSchedulersClients(t *testing.T) {
	// The scheduler's per-client limit applies to the key's name, whatever
	// "user" the body claims.
	f := newFixture(t, fixtureOpts{
		handler: []openai.Option{openai.WithAPIKeys(openai.Key{Name: "app", Secret: normalKey})},
		server:  []mlxserving.Option{mlxserving.WithSchedulerOptions(scheduler.WithRateLimit(0.01, 1))},
	})
	want := []int{200, 429}
	for i, user := range []string{"a", "b"} {
		body := `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"user":"` + user + `"}`
		status, _, out := f.post(t, "/v1/chat/completions", body, bearer(normalKey)...)
		if status != want[i] {
			t.Fatalf("user %s: %d %s, want %d", user, status, out, want[i])
		}
		if status == 429 && !strings.Contains(string(out), `\"app\"`) {
			t.Errorf("429 names another client: %s", out)
		}
	}
}

func TestAPIKeyOptions(t *testing.T) {
	bad := [][]openai.Key{
		{},
		{{Name: "", Secret: "sk-0123456789"}},
		{{Name: "a"}},
		{{Name: "a", Secret: "short"}},
		{{Name: "a", Secret: "sk-0123456789", SHA256: sha("x")}},
		{{Name: "a", SHA256: "zz"}},
		{{Name: "a", Secret: "sk-0123456789", MaxTier: "urgent"}},
		{{Name: "a", Secret: "sk-0123456789", RequestsPerMinute: -1}},
		{{Name: "a", Secret: "sk-0123456789"}, {Name: "a", Secret: "sk-9876543210"}},
		{{Name: "a", Secret: "sk-0123456789"}, {Name: "b", SHA256: sha("sk-0123456789")}},
	}
	f := newFixture(t, fixtureOpts{})
	for i, keys := range bad {
		if _, err := openai.New(f.srv, openai.WithAPIKeys(keys...)); !errors.Is(err, openai.ErrBadKeys) {
			t.Errorf("case %d: %v, want ErrBadKeys", i, err)
		}
	}
}

func TestKeyFileAndList(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.json")
	os.WriteFile(path, []byte(`{"keys":[{"name":"ops","key_sha256":"`+sha(adminKey)+`","admin":true},
		{"name":"app","key":"`+normalKey+`","max_tier":"high","models":["tiny"],"requests_per_minute":5}]}`), 0o600)
	keys, err := openai.LoadKeyFile(path)
	if err != nil || len(keys) != 2 || keys[1].MaxTier != "high" || keys[1].RequestsPerMinute != 5 {
		t.Fatalf("%+v, %v", keys, err)
	}
	for _, body := range []string{`{"keys":[{"name":"x","secret":"y"}]}`, `not json`, `{}`, `{"keys":[{"name":"a"}]`} {
		os.WriteFile(path, []byte(body), 0o600)
		if _, err := openai.LoadKeyFile(path); !errors.Is(err, openai.ErrBadKeys) {
			t.Errorf("%s: %v, want ErrBadKeys", body, err)
		}
	}
	os.WriteFile(path, make([]byte, 2<<20), 0o600)
	if _, err := openai.LoadKeyFile(path); !errors.Is(err, openai.ErrBadKeys) {
		t.Errorf("2 MB file: %v", err)
	}
	list, err := openai.ParseKeyList("ops:" + adminKey + ", ci:sk-ci-0123456789")
	if err != nil || len(list) != 2 || list[1].Name != "ci" || !list[1].Admin {
		t.Fatalf("%+v, %v", list, err)
	}
	for _, s := range []string{"", "nokey", ":x", "a:"} {
		if _, err := openai.ParseKeyList(s); !errors.Is(err, openai.ErrBadKeys) {
			t.Errorf("%q: %v", s, err)
		}
	}
}

// TestShutdownIs503: a request running when the Server closes gets the
// documented 503, not a 500.
func TestShutdownIs503(t *testing.T) {
	f := newFixture(t, fixtureOpts{sim: []enginetest.SimOption{enginetest.WithStepTime(5*time.Millisecond, 0)}})
	type result struct {
		status int
		body   []byte
	}
	done := make(chan result, 1)
	go func() {
		status, _, body := f.post(t, "/v1/completions", `{"model":"tiny","prompt":"hi","max_tokens":400,"ignore_eos":true}`)
		done <- result{status, body}
	}()
	waitFor(t, "the request to run", func() bool { return f.srv.Stats()["tiny"].Batcher.Running == 1 })
	if err := f.srv.Close(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.status != http.StatusServiceUnavailable || errCode(t, r.body) != "unavailable" {
		t.Fatalf("%d %s, want 503 unavailable", r.status, r.body)
	}
}

// TestTemplateErrorIs400: a chat template that fails for a request (here
// it raises on a tool message) is a 400 for that request only.
func TestTemplateErrorIs400(t *testing.T) {
	dir := templateCheckpoint(t, `{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('tool messages are not supported') }}{% endif %}{{ m.content }}{% endfor %}`)
	f := newFixture(t, fixtureOpts{dir: dir})
	status, _, body := f.post(t, "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"tool","content":"x","tool_call_id":"1"}],"max_tokens":2}`)
	if status != 400 || errCode(t, body) != "template_error" || !strings.Contains(string(body), "tool messages are not supported") {
		t.Fatalf("%d %s", status, body)
	}
	if status, _, body := f.post(t, "/v1/chat/completions", keyChatBody); status != 200 {
		t.Fatalf("after a template error: %d %s", status, body)
	}
}

// A 404 says only what the caller may know: the name it sent, not which
// models are loaded (another key's model among them).
func TestHiddenModelErrorSaysOnlyTheName(t *testing.T) {
	f := keyedFixture(t)
	for _, path := range []string{"/v1/models/tiny", "/v1/models/nope"} {
		req, _ := http.NewRequest(http.MethodGet, f.ts.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+otherKey)
		resp, err := f.ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		name := strings.TrimPrefix(path, "/v1/models/")
		msg, _ := mustJSON(t, body)["error"].(map[string]any)["message"].(string)
		if resp.StatusCode != 404 || msg != fmt.Sprintf("model %q not found", name) {
			t.Errorf("GET %s with a key limited to another model: %d %q, want 404 %q", path, resp.StatusCode, msg, fmt.Sprintf("model %q not found", name))
		}
	}
}

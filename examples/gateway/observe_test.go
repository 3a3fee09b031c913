package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/openai"
)

// call sends a request with key (none when empty) and returns the status
// and body.
func call(t *testing.T, client *http.Client, method, url, key, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// checkMetrics: /metrics answers an admin key with the balancer's and the
// gateway's instruments in Prometheus's text format, and refuses others.
func checkMetrics(t *testing.T, client *http.Client, base string) {
	t.Helper()
	if code, _ := call(t, client, http.MethodGet, base+"/metrics", "app-secret", ""); code != http.StatusForbidden {
		t.Errorf("/metrics with a key that is not an admin's: %d, want 403", code)
	}
	code, body := call(t, client, http.MethodGet, base+"/metrics", "ops-secret", "")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	for _, want := range []string{
		`mlxserving_lb_requests_total{`, `result="routed"`,
		`mlxserving_lb_backend_requests_total{backend="node-1"`,
		`mlxserving_lb_backend_in_flight{backend="node-1"`,
		`mlxserving_lb_backend_healthy{backend="node-1"`,
		`mlxserving_lb_backend_draining{backend="node-1"`,
		`mlxserving_breaker_state{breaker="node-1"`,
		`mlxserving_lb_route_duration_seconds_bucket{`,
		`mlxserving_gateway_nats_connected{`,
		`mlxserving_gateway_instances{`,
		`mlxserving_gateway_nats_reconnects_total{`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}

// checkStats: the stats endpoint answers an admin key with the backends,
// their load, breakers and draining, the request counts and the NATS
// connection, and refuses a key that is not an admin's (403) or none
// (401).
func checkStats(t *testing.T, client *http.Client, base string) {
	t.Helper()
	if code, _ := call(t, client, http.MethodGet, base+statsPath, "", ""); code != http.StatusUnauthorized {
		t.Errorf("%s without a key: %d, want 401", statsPath, code)
	}
	if code, _ := call(t, client, http.MethodGet, base+statsPath, "app-secret", ""); code != http.StatusForbidden {
		t.Errorf("%s with a key that is not an admin's: %d, want 403", statsPath, code)
	}
	if code, _ := call(t, client, http.MethodPost, base+statsPath, "ops-secret", "{}"); code != http.StatusMethodNotAllowed {
		t.Errorf("POST %s: %d, want 405", statsPath, code)
	}
	code, body := call(t, client, http.MethodGet, base+statsPath, "ops-secret", "")
	if code != http.StatusOK {
		t.Fatalf("%s: %d %s", statsPath, code, body)
	}
	var st stats
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("%s: %v: %s", statsPath, err, body)
	}
	if len(st.Backends) != 1 {
		t.Fatalf("%s: backends %+v, want node-1", statsPath, st.Backends)
	}
	b := st.Backends[0]
	if b.Name != "node-1" || !b.Healthy || b.Draining || b.Breaker.State != "closed" || b.Routed == 0 ||
		len(b.Load.Models) != 1 || b.Load.Models[0] != "tiny" || b.Load.Updated == nil {
		t.Errorf("%s: backend %+v", statsPath, b)
	}
	if st.Requests.Routed == 0 || st.NATS == nil || st.NATS.Status != "CONNECTED" || len(st.NATS.Instances) != 1 {
		t.Errorf("%s: %s", statsPath, body)
	}
}

// TestAdminOnly: keys given as their SHA-256 count as keys given in
// full; without keys, everyone passes (as /metrics does).
func TestAdminOnly(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	sum := sha256.Sum256([]byte("ops-secret"))
	keys := []openai.Key{{Name: "ops", SHA256: hex.EncodeToString(sum[:]), Admin: true}, {Name: "app", Secret: "app-secret"}}
	for _, tc := range []struct {
		keys []openai.Key
		auth string
		want int
	}{
		{keys, "Bearer ops-secret", http.StatusNoContent},
		{keys, "bearer  ops-secret ", http.StatusNoContent},
		{keys, "Bearer app-secret", http.StatusForbidden},
		{keys, "Bearer nope-secret", http.StatusUnauthorized},
		{keys, "Basic ops-secret", http.StatusUnauthorized},
		{keys, "", http.StatusUnauthorized},
		{nil, "", http.StatusNoContent},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, statsPath, nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		adminOnly(tc.keys, ok).ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("%d keys, Authorization %q: %d, want %d", len(tc.keys), tc.auth, rec.Code, tc.want)
		}
	}
}

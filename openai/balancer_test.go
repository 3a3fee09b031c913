package openai_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/openai"
)

// The handler serves a load balancer as it serves a single Server: two
// instances behind one endpoint, both used.
func TestHandlerOverLoadBalancer(t *testing.T) {
	a, b := newFixture(t, fixtureOpts{}), newFixture(t, fixtureOpts{})
	lb, err := balancer.New(balancer.WithStrategy(balancer.RoundRobin()))
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	_ = lb.Add("a", a.srv)
	_ = lb.Add("b", b.srv)
	h, err := openai.New(lb)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	defer ts.Close()
	f := &fixture{ts: ts}
	for i := range 4 {
		status, _, body := f.post(t, "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`)
		if status != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, status, body)
		}
	}
	for _, be := range lb.Stats().Backends {
		if be.Routed != 2 {
			t.Errorf("backend %s served %d of 4", be.Name, be.Routed)
		}
	}
	resp, err := ts.Client().Get(ts.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct{ ID string } `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Data) != 1 || list.Data[0].ID != "tiny" {
		t.Fatalf("/v1/models over the balancer: %+v %v", list, err)
	}
	// Every instance gone: a typed 503 with Retry-After.
	_ = a.srv.Close()
	_ = b.srv.Close()
	status, hdr, body := f.post(t, "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`)
	if status != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" || !strings.Contains(string(body), "backend") {
		t.Fatalf("all backends down: %d %v %s", status, hdr, body)
	}
}

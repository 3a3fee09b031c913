package openai_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/prewarm"
)

func TestModelsListKnownModelsWithState(t *testing.T) {
	f := newFixture(t, fixtureOpts{
		sim:    []enginetest.SimOption{enginetest.WithMemory(400_000, 0)},
		server: []mlxserving.Option{mlxserving.WithMemoryBudget(600_000)},
	})
	lazy := checkpoint(t)
	if err := f.srv.RegisterModel(prewarm.Model{Spec: engine.ModelSpec{ID: "lazy", Path: lazy}}); err != nil {
		t.Fatal(err)
	}
	status, body := f.get(t, "/v1/models")
	for _, want := range []string{`"id":"lazy","object":"model"`, `"state":"unloaded"`, `"id":"tiny"`, `"state":"loaded","pinned":true`} {
		if status != 200 || !strings.Contains(string(body), want) {
			t.Fatalf("/v1/models: %d %s; want %s", status, body, want)
		}
	}
	// tiny is pinned (LoadModel); lazy (its checkpoint is ~495 kB) does not
	// fit next to it.
	code, hdr, body := f.post(t, "/v1/completions", `{"model":"lazy","prompt":"hi","max_tokens":2}`)
	if code != 503 || hdr.Get("Retry-After") == "" || !strings.Contains(string(body), "memory_budget_exhausted") {
		t.Fatalf("over budget: %d %v %s", code, hdr, body)
	}
	if err := f.srv.UnloadModel(context.Background(), "tiny"); err != nil {
		t.Fatal(err)
	}
	// Loaded on demand, and unloaded when idle as keep_alive 0 asks.
	code, _, body = f.post(t, "/v1/completions", `{"model":"lazy","prompt":"hi","max_tokens":2,"keep_alive":"1h"}`)
	if code != 200 {
		t.Fatalf("on-demand load: %d %s", code, body)
	}
	status, body = f.get(t, "/v1/models/lazy")
	m := mustJSON(t, body)
	if status != 200 || m["state"] != "loaded" || m["memory_bytes"] != 400000.0 || m["engine"] != "sim" {
		t.Fatalf("/v1/models/lazy: %d %s", status, body)
	}
	if until := int64(m["idle_until"].(float64)); time.Until(time.Unix(until, 0)) < 59*time.Minute {
		t.Fatalf("idle_until %v, want an hour from now", time.Unix(until, 0))
	}
	code, _, body = f.post(t, "/v1/completions", `{"model":"lazy","prompt":"hi","max_tokens":2,"keep_alive":0}`)
	if code != 200 {
		t.Fatalf("keep_alive 0: %d %s", code, body)
	}
	waitFor(t, "lazy to unload", func() bool {
		_, body := f.get(t, "/v1/models/lazy")
		return strings.Contains(string(body), `"state":"unloaded"`)
	})
	code, _, body = f.post(t, "/v1/completions", `{"model":"lazy","prompt":"hi","max_tokens":2,"keep_alive":"later"}`)
	if code != 400 || !strings.Contains(string(body), `"param":"keep_alive"`) {
		t.Fatalf("bad keep_alive: %d %s", code, body)
	}
	// Unknown models stay 404.
	code, _, body = f.post(t, "/v1/completions", `{"model":"nope","prompt":"hi","max_tokens":2}`)
	if code != 404 {
		t.Fatalf("unknown model: %d %s", code, body)
	}
}

package openai_test

import (
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/retry"
)

// TestDeadlineStatus: a request whose first token misses the server's
// deadline gets a 504 naming that deadline, and the server keeps serving.
func TestDeadlineStatus(t *testing.T) {
	f := newFixture(t, fixtureOpts{
		sim:    []enginetest.SimOption{enginetest.WithStepTime(80*time.Millisecond, 0)},
		server: []mlxserving.Option{mlxserving.WithDeadlines(retry.Deadlines{FirstToken: 20 * time.Millisecond})},
	})
	status, _, body := f.post(t, "/v1/completions", map[string]any{"model": "tiny", "prompt": "hi", "max_tokens": 4})
	e, _ := mustJSON(t, body)["error"].(map[string]any)
	if status != 504 || e == nil || e["code"] != "time_to_first_token_exceeded" {
		t.Fatalf("status %d, body %s", status, body)
	}
	waitFor(t, "the sequence freed", func() bool { return f.sim.Stats().OpenSequences == 0 })
	if status, _ := f.get(t, "/health"); status != 200 {
		t.Errorf("health after a deadline: %d", status)
	}
}

// TestStreamEndsWithErrorEventThenDone: a stream cut by its total deadline
// after tokens ends with an error event that names the deadline, then
// [DONE], so every SSE reader ends cleanly.
func TestStreamEndsWithErrorEventThenDone(t *testing.T) {
	f := newFixture(t, fixtureOpts{
		sim:    []enginetest.SimOption{enginetest.WithStepTime(5*time.Millisecond, 0)},
		server: []mlxserving.Option{mlxserving.WithDeadlines(retry.Deadlines{Total: 100 * time.Millisecond})},
	})
	status, _, body := f.post(t, "/v1/completions", map[string]any{"model": "tiny", "prompt": "hi", "max_tokens": 400, "stream": true, "ignore_eos": true})
	events := strings.Split(strings.TrimSpace(string(body)), "\n\n")
	n := len(events)
	if status != 200 || n < 3 || events[n-1] != "data: [DONE]" || !strings.Contains(events[n-2], `"code":"request_timeout"`) ||
		!strings.Contains(events[n-3], `"text"`) {
		t.Fatalf("status %d, last events %q", status, events[max(0, n-3):])
	}
}

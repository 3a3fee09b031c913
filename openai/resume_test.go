package openai_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/internal/syncbuf"
	"github.com/mlxserving/mlxserving/openai"
	"github.com/mlxserving/mlxserving/retry"
)

// TestResumedStreamSaysSo: a stream whose worker is lost after tokens goes
// on and ends with the ": finished" comment counting its resumes, and the
// request's log line records the event; a stream that did not resume has
// no comment.
func TestResumedStreamSaysSo(t *testing.T) {
	var logs syncbuf.Buffer
	policy := retry.MustPolicy(retry.WithMaxAttempts(1000), retry.WithBackoff(time.Microsecond, time.Microsecond, 1))
	f := newFixture(t, fixtureOpts{
		sim:     []enginetest.SimOption{enginetest.WithWorkerLoss(0.3, 11)},
		server:  []mlxserving.Option{mlxserving.WithBatcherOptions(batcher.WithRetryPolicy(policy))},
		handler: []openai.Option{openai.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))},
	})
	resumed := 0
	for i := range 10 {
		status, _, body := f.post(t, "/v1/completions", map[string]any{"model": "tiny", "prompt": strings.Repeat("a", i+1),
			"max_tokens": 20, "ignore_eos": true, "stream": true})
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, body)
		}
		if !bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) || bytes.Contains(body, []byte(`"error"`)) {
			t.Fatalf("stream did not end cleanly: %s", body)
		}
		if i := bytes.Index(body, []byte(": finished resumes=")); i >= 0 {
			resumed++
			if !bytes.Contains(body[i:], []byte(" resume_gap_ms=")) {
				t.Errorf("comment without the gap: %s", body[i:])
			}
		} else if bytes.Contains(body, []byte(": finished")) {
			t.Errorf("a comment naming no resume and no backend: %s", body)
		}
	}
	if resumed == 0 {
		t.Fatal("no stream resumed at a loss rate of 0.3")
	}
	if n := strings.Count(logs.String(), `msg="request resumed"`); n != resumed {
		t.Errorf("%d \"request resumed\" log lines for %d resumed streams:\n%s", n, resumed, logs.String())
	}
}

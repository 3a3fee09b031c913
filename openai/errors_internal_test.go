package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/tokenizer"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
)

// TestErrorTable checks the one mapping from the library's errors to
// statuses, including the errors a live test cannot provoke on demand.
func TestErrorTable(t *testing.T) {
	cases := []struct {
		err        error
		status     int
		code       string
		retryAfter string
	}{
		{&engine.InvalidParamError{Param: "top_p", Reason: "bad"}, 400, "invalid_value", ""},
		{&engine.ContextLengthError{Model: "m", Prompt: 600, Limit: 512}, 400, "context_length_exceeded", ""},
		{&scheduler.CapacityError{Model: "m", Prompt: 10, MaxNew: 10, Capacity: 15}, 400, "exceeds_kv_capacity", ""},
		{&api.UnknownTierError{Value: "x"}, 400, "invalid_value", ""},
		{&mlxserving.ModelNotFoundError{Model: "x"}, 404, "model_not_found", ""},
		{fmt.Errorf("chat: %w", mlxserving.ErrNoTokenizer), 400, "unsupported_model", ""},
		{&bodyTooLargeError{limit: 10}, 413, "request_too_large", ""},
		{&scheduler.QueueFullError{Queued: 5, MaxQueued: 5, RetryAfter: 1500 * time.Millisecond}, 429, "queue_full", "2"},
		{&scheduler.RateLimitError{Client: "c", RetryAfter: 3 * time.Second}, 429, "rate_limit_exceeded", "3"},
		{fmt.Errorf("open: %w", engine.ErrOutOfMemory), 503, "out_of_memory", "1"},
		{mlxserving.ErrServerClosed, 503, "unavailable", "1"},
		{mlxserving.ErrModelUnloaded, 503, "unavailable", "1"},
		{fmt.Errorf("stream: %w", batcher.ErrClosed), 503, "unavailable", "1"},
		{scheduler.ErrClosed, 503, "unavailable", "1"},
		{&engine.InvalidParamError{Param: "messages", Reason: "r", Err: &tokenizer.TemplateError{Reason: "r"}}, 400, "template_error", ""},
		{fmt.Errorf("load: %w", engine.ErrUnavailable), 503, "unavailable", "1"},
		{fmt.Errorf("step: %w", engine.ErrWorkerLost), 503, "worker_unavailable", "1"},
		{&retry.ExhaustedError{Attempts: 3, Err: engine.ErrWorkerLost}, 503, "worker_unavailable", "1"},
		{&retry.OpenError{Name: "worker-0", State: retry.StateOpen}, 503, "worker_unavailable", "1"},
		{&retry.InterruptedError{Delivered: 4, Err: engine.ErrWorkerLost}, 502, "stream_interrupted", ""},
		{&retry.DeadlineError{Kind: retry.FirstToken, Limit: time.Second}, 504, "time_to_first_token_exceeded", ""},
		{&retry.DeadlineError{Kind: retry.Stall, Limit: time.Second, Tokens: 3}, 504, "stall_timeout", ""},
		{fmt.Errorf("x: %w", &retry.DeadlineError{Kind: retry.Total, Limit: time.Second}), 504, "request_timeout", ""},
		{context.DeadlineExceeded, 504, "timeout", ""},
		{&prewarm.BudgetError{Model: "m", Need: 10, Used: 20, Budget: 25, Retry: 4 * time.Second}, 503, "memory_budget_exhausted", "4"},
		{&prewarm.LoadError{Model: "m", Attempts: 1, RetryAt: time.Now().Add(9500 * time.Millisecond), Err: &engine.CheckpointError{Path: "x", Reason: "bad"}}, 503, "model_load_failed", "10"},
		{fmt.Errorf("x: %w", prewarm.ErrAborted), 503, "unavailable", "1"},
	}
	for _, c := range cases {
		w := httptest.NewRecorder()
		writeError(w, c.err)
		var body struct {
			Error struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
				Code    *string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("%v: body %q: %v", c.err, w.Body, err)
		}
		if w.Code != c.status || body.Error.Code == nil || *body.Error.Code != c.code || (body.Error.Message != c.err.Error() && c.status != 413 && c.status != 404) || body.Error.Type == "" {
			t.Errorf("%T %v: %d %s; want %d code %s", c.err, c.err, w.Code, w.Body, c.status, c.code)
		}
		if got := w.Header().Get("Retry-After"); got != c.retryAfter {
			t.Errorf("%v: Retry-After %q, want %q", c.err, got, c.retryAfter)
		}
	}
}

// FuzzAppendString checks the streaming path's JSON string encoder
// against encoding/json: same decoded value for any input.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "hello", "quote\" back\\slash", "\n\r\t\x00\x1f", "héllo 世界 🎉", "\xff\xfe bad", "\u2028\u2029", "<&>"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := appendString(nil, s)
		var got string
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("appendString(%q) = %s: invalid JSON: %v", s, b, err)
		}
		want := strings.ToValidUTF8(s, "\ufffd")
		ref, _ := json.Marshal(s)
		var refDecoded string
		_ = json.Unmarshal(ref, &refDecoded)
		if got != refDecoded && got != want {
			t.Fatalf("appendString(%q) decodes to %q; encoding/json gives %q", s, got, refDecoded)
		}
		if !utf8.Valid(b) {
			t.Fatalf("appendString(%q) is not UTF-8", s)
		}
	})
}

package retry_test

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/httpbackend"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/pyproc"
	"github.com/mlxserving/mlxserving/engine/tokenizer"
	"github.com/mlxserving/mlxserving/merge"
	"github.com/mlxserving/mlxserving/openai"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
	"github.com/mlxserving/mlxserving/session"
)

// TestClassifyEveryError: every sentinel and typed error of the module
// that reaches a caller has one class, and every decision derives from
// it: retry, breaker, failover, HTTP status and metrics outcome.
func TestClassifyEveryError(t *testing.T) {
	const (
		R = 1 << iota // Retryable
		F             // CountsAsFailure
		O             // FailsOver
	)
	lost := fmt.Errorf("step: %w", engine.ErrWorkerLost)
	cases := []struct {
		name    string
		err     error
		kind    retry.Kind
		code    string
		flags   int
		status  int
		outcome string
	}{
		{"nil", nil, retry.OK, "", 0, 200, "ok"},
		// engine
		{"invalid param", &engine.InvalidParamError{Param: "top_p", Reason: "x"}, retry.Invalid, "invalid_value", 0, 400, "invalid"},
		{"invalid param sentinel", engine.ErrInvalidParam, retry.Invalid, "invalid_value", 0, 400, "invalid"},
		{"context length", &engine.ContextLengthError{Model: "m", Prompt: 9, Limit: 8}, retry.ContextLength, "context_length_exceeded", 0, 400, "invalid"},
		{"model not found", engine.ErrModelNotFound, retry.NotFound, "model_not_found", O, 404, "not_found"},
		{"out of memory", engine.ErrOutOfMemory, retry.Overloaded, "out_of_memory", O, 503, "rejected"},
		{"worker lost", lost, retry.Unavailable, "worker_unavailable", R | F | O, 503, "unavailable"},
		{"pyproc lost", &pyproc.LostError{Worker: 1, Reason: "exit 9"}, retry.Unavailable, "worker_unavailable", R | F | O, 503, "unavailable"},
		{"engine closed", engine.ErrClosed, retry.Unavailable, "unavailable", F | O, 503, "unavailable"},
		{"engine unavailable", engine.ErrUnavailable, retry.Unavailable, "unavailable", F | O, 503, "unavailable"},
		{"bad checkpoint", &engine.CheckpointError{Path: "x", Reason: "y"}, retry.Internal, "engine_error", O, 500, "error"},
		{"template", &engine.InvalidParamError{Param: "messages", Reason: "r", Err: &tokenizer.TemplateError{Reason: "r"}}, retry.Invalid, "template_error", 0, 400, "invalid"},
		// api
		{"unknown tier", &api.UnknownTierError{Value: "gold"}, retry.Invalid, "invalid_value", 0, 400, "invalid"},
		{"abandoned stream", api.ErrAbandoned, retry.Canceled, "canceled", 0, 499, "cancelled"},
		{"balancer closed", balancer.ErrClosed, retry.Unavailable, "unavailable", F | O, 503, "unavailable"},
		// retry
		{"breaker open", &retry.OpenError{Name: "w", State: retry.StateOpen}, retry.Unavailable, "worker_unavailable", R | O, 503, "unavailable"},
		{"interrupted lost", &retry.InterruptedError{Delivered: 2, Err: lost}, retry.Interrupted, "stream_interrupted", F, 502, "error"},
		{"interrupted bad", &retry.InterruptedError{Delivered: 2, Err: engine.ErrInvalidParam}, retry.Interrupted, "stream_interrupted", 0, 502, "error"},
		{"stall", &retry.DeadlineError{Kind: retry.Stall}, retry.Deadline, "stall_timeout", F, 504, "deadline"},
		{"ttft", &retry.DeadlineError{Kind: retry.FirstToken}, retry.Deadline, "time_to_first_token_exceeded", 0, 504, "deadline"},
		{"total", &retry.DeadlineError{Kind: retry.Total}, retry.Deadline, "request_timeout", 0, 504, "deadline"},
		{"permanent lost", retry.Permanent(lost), retry.Unavailable, "worker_unavailable", F | O, 503, "unavailable"},
		{"exhausted", &retry.ExhaustedError{Attempts: 3, Err: lost}, retry.Unavailable, "worker_unavailable", F | O, 503, "unavailable"},
		{"status 429 hint", &retry.StatusError{Code: 429, RetryAfter: time.Second}, retry.Overloaded, "queue_full", R | O, 429, "rejected"},
		{"status 429", &retry.StatusError{Code: 429}, retry.Overloaded, "queue_full", O, 429, "rejected"},
		{"status 503 hint", &retry.StatusError{Code: 503, RetryAfter: time.Second}, retry.Unavailable, "unavailable", R | F | O, 503, "unavailable"},
		{"status 500", &retry.StatusError{Code: 500, RetryAfter: time.Second}, retry.Internal, "engine_error", F | O, 500, "error"},
		{"status 404", &retry.StatusError{Code: 404}, retry.NotFound, "model_not_found", O, 404, "not_found"},
		{"status 400", &retry.StatusError{Code: 400}, retry.Invalid, "invalid_value", 0, 400, "invalid"},
		// the caller and the network
		{"canceled", context.Canceled, retry.Canceled, "canceled", 0, 499, "cancelled"},
		{"timeout", fmt.Errorf("x: %w", context.DeadlineExceeded), retry.Deadline, "timeout", O, 504, "deadline"},
		{"refused", fmt.Errorf("dial: %w", syscall.ECONNREFUSED), retry.Unavailable, "worker_unavailable", R | F | O, 503, "unavailable"},
		{"reset", fmt.Errorf("read: %w", syscall.ECONNRESET), retry.Unavailable, "worker_unavailable", R | F | O, 503, "unavailable"},
		{"plain", errors.New("boom"), retry.Internal, "engine_error", O, 500, "error"},
		// scheduler
		{"queue full hint", &scheduler.QueueFullError{RetryAfter: time.Second}, retry.Overloaded, "queue_full", R | O, 429, "rejected"},
		{"queue full", &scheduler.QueueFullError{}, retry.Overloaded, "queue_full", O, 429, "rejected"},
		{"rate limited", &scheduler.RateLimitError{RetryAfter: time.Second}, retry.Overloaded, "rate_limit_exceeded", R, 429, "rejected"},
		{"capacity", &scheduler.CapacityError{Model: "m", Prompt: 9, MaxNew: 9, Capacity: 10}, retry.Invalid, "exceeds_kv_capacity", O, 400, "invalid"},
		{"no backend", &balancer.NoBackendError{Model: "m", RetryAfter: time.Second, Last: lost}, retry.Overloaded, "no_backend_available", R | O, 503, "rejected"},
		{"scheduler closed", scheduler.ErrClosed, retry.Unavailable, "unavailable", F | O, 503, "unavailable"},
		// model manager, sessions, server, batcher, merging
		{"budget", &prewarm.BudgetError{Model: "m", Retry: time.Second}, retry.Overloaded, "memory_budget_exhausted", R | O, 503, "rejected"},
		{"load failed", &prewarm.LoadError{Model: "m", RetryAt: time.Now().Add(time.Minute), Err: &engine.CheckpointError{}}, retry.Unavailable, "model_load_failed", R | O, 503, "unavailable"},
		{"aborted", prewarm.ErrAborted, retry.Unavailable, "unavailable", F | O, 503, "unavailable"},
		{"unknown model", prewarm.ErrUnknownModel, retry.NotFound, "model_not_found", O, 404, "not_found"},
		{"prewarm closed", prewarm.ErrClosed, retry.Unavailable, "unavailable", F | O, 503, "unavailable"},
		{"session id", session.ErrInvalidID, retry.Invalid, "invalid_value", 0, 400, "invalid"},
		{"session closed", session.ErrClosed, retry.Unavailable, "unavailable", F | O, 503, "unavailable"},
		{"server closed", mlxserving.ErrServerClosed, retry.Unavailable, "unavailable", F | O, 503, "unavailable"},
		{"not loaded", &mlxserving.ModelNotFoundError{Model: "m"}, retry.NotFound, "model_not_found", O, 404, "not_found"},
		{"no tokenizer", mlxserving.ErrNoTokenizer, retry.Invalid, "unsupported_model", 0, 400, "invalid"},
		{"unloaded", mlxserving.ErrModelUnloaded, retry.Unavailable, "unavailable", F | O, 503, "unavailable"},
		{"batcher closed", batcher.ErrClosed, retry.Unavailable, "unavailable", F | O, 503, "unavailable"},
		{"merge closed", merge.ErrClosed, retry.Unavailable, "unavailable", F | O, 503, "unavailable"},
		// transports
		{"http closed", httpbackend.ErrClosed, retry.Unavailable, "unavailable", F | O, 503, "unavailable"},
		{"http 429", &httpbackend.Error{Status: 429}, retry.Overloaded, "queue_full", O, 429, "rejected"},
		{"http 429 hint", &httpbackend.Error{Status: 429, RetryAfter: time.Second}, retry.Overloaded, "queue_full", R | O, 429, "rejected"},
		{"http queue full", &httpbackend.Error{Status: 429, Code: "queue_full", RetryAfter: time.Second}, retry.Overloaded, "queue_full", R | O, 429, "rejected"},
		{"http rate limited", &httpbackend.Error{Status: 429, Code: "rate_limit_exceeded", RetryAfter: time.Second}, retry.Overloaded, "rate_limit_exceeded", R, 429, "rejected"},
		{"http truncated", &httpbackend.Error{Err: httpbackend.ErrTruncated}, retry.Internal, "engine_error", R | F | O, 500, "error"},
		{"http 502", &httpbackend.Error{Status: 502}, retry.Internal, "engine_error", F | O, 500, "error"},
		{"http not found", &httpbackend.Error{Status: 404, Code: "model_not_found"}, retry.NotFound, "model_not_found", O, 404, "not_found"},
		{"nats closed", natsbackend.ErrClosed, retry.Unavailable, "unavailable", F | O, 503, "unavailable"},
	}
	for _, tc := range cases {
		c := retry.Classify(tc.err)
		flags := 0
		if c.Retryable() {
			flags |= R
		}
		if c.CountsAsFailure() {
			flags |= F
		}
		if c.FailsOver() {
			flags |= O
		}
		if c.Kind != tc.kind || c.Code != tc.code || flags != tc.flags || openai.Status(c) != tc.status || c.Outcome() != tc.outcome {
			t.Errorf("%s: %v: retryable %v, fault %v, fails over %v, status %d, outcome %s; want %v/%s, flags %03b, %d, %s",
				tc.name, c, flags&R != 0, flags&F != 0, flags&O != 0, openai.Status(c), c.Outcome(),
				tc.kind, tc.code, tc.flags, tc.status, tc.outcome)
		}
		if retry.Retryable(tc.err) != c.Retryable() || retry.CountsAsFailure(tc.err) != c.CountsAsFailure() {
			t.Errorf("%s: Retryable or CountsAsFailure disagree with Classify", tc.name)
		}
	}
}

// TestOverloadRetriedOnlyWithHint: a 429 is retried when it says when,
// whichever transport it came through: httpbackend once retried any 429,
// retry only one with a Retry-After.
func TestOverloadRetriedOnlyWithHint(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&httpbackend.Error{Status: 429}, false},
		{&retry.StatusError{Code: 429}, false},
		{&scheduler.QueueFullError{}, false},
		{&httpbackend.Error{Status: 429, RetryAfter: time.Second}, true},
		{&retry.StatusError{Code: 429, RetryAfter: time.Second}, true},
		{&scheduler.QueueFullError{RetryAfter: time.Second}, true},
	} {
		if got := retry.Retryable(tc.err); got != tc.want {
			t.Errorf("%v: Retryable %v, want %v", tc.err, got, tc.want)
		}
		if e, ok := tc.err.(*httpbackend.Error); ok && e.Retryable() != tc.want {
			t.Errorf("%v: httpbackend Retryable %v, want %v", tc.err, e.Retryable(), tc.want)
		}
	}
}

// TestClassifyOutermost: the outermost error that names a class decides,
// and a remote status only when nothing else does.
func TestClassifyOutermost(t *testing.T) {
	nb := &balancer.NoBackendError{Model: "m", Last: &scheduler.QueueFullError{}}
	if c := retry.Classify(nb); c.Code != retry.CodeNoBackend {
		t.Errorf("no backend over queue full: %v", c)
	}
	ctx := &httpbackend.Error{Status: 400, Code: "context_length_exceeded"}
	if c := retry.Classify(ctx); c.Kind != retry.ContextLength {
		t.Errorf("a 400 naming context length: %v", c)
	}
	if c := retry.Classify(fmt.Errorf("%w: %w", mlxserving.ErrServerClosed, prewarm.ErrAborted)); c.Code != retry.CodeUnavailable {
		t.Errorf("closed while loading: %v", c)
	}
	if got := retry.KindOf("no_such_code"); got != retry.Internal {
		t.Errorf("unknown code: %v", got)
	}
	if got := retry.Kind(200).String(); got != "Kind(200)" {
		t.Errorf("Kind(200): %q", got)
	}
}

// TestPolicyBackoff: the nominal wait after n failures grows by the
// multiplier from the first wait up to the most.
func TestPolicyBackoff(t *testing.T) {
	p := retry.MustPolicy(retry.WithBackoff(10*time.Second, 5*time.Minute, 2))
	for n, want := range []time.Duration{0, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second,
		160 * time.Second, 5 * time.Minute, 5 * time.Minute} {
		if got := p.Backoff(n); got != want {
			t.Errorf("Backoff(%d) = %v, want %v", n, got, want)
		}
	}
}

// TestTrackerWait: Wait sleeps the backoff before a retry, returns the
// error when the policy refuses another attempt, and ctx's error when it
// ends first.
func TestTrackerWait(t *testing.T) {
	p := retry.MustPolicy(retry.WithBackoff(20*time.Millisecond, 20*time.Millisecond, 1), retry.WithJitter(0), retry.WithMaxAttempts(2))
	tr := p.Start()
	start := time.Now()
	if err := tr.Wait(context.Background(), engine.ErrWorkerLost); err != nil {
		t.Fatalf("first retry: %v", err)
	}
	if waited := time.Since(start); waited < 20*time.Millisecond {
		t.Errorf("retried after %v, before the 20ms backoff", waited)
	}
	if err := tr.Wait(context.Background(), engine.ErrWorkerLost); !errors.Is(err, engine.ErrWorkerLost) {
		t.Errorf("attempts used up: %v", err)
	}
	if err := p.Start().Wait(context.Background(), engine.ErrInvalidParam); !errors.Is(err, engine.ErrInvalidParam) {
		t.Errorf("not retryable: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Start().Wait(ctx, engine.ErrWorkerLost); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

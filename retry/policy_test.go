package retry_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

func TestRetryable(t *testing.T) {
	lost := fmt.Errorf("worker 0: %w", engine.ErrWorkerLost)
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"worker lost", lost, true},
		{"connection refused", fmt.Errorf("dial: %w", syscall.ECONNREFUSED), true},
		{"connection reset", fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{"breaker open", &retry.OpenError{Name: "b1", State: retry.StateOpen}, true},
		{"429 with Retry-After", &retry.StatusError{Code: http.StatusTooManyRequests, RetryAfter: time.Second}, true},
		{"503 with Retry-After", &retry.StatusError{Code: http.StatusServiceUnavailable, RetryAfter: time.Second}, true},
		{"429 without Retry-After", &retry.StatusError{Code: http.StatusTooManyRequests}, false},
		{"500", &retry.StatusError{Code: http.StatusInternalServerError, RetryAfter: time.Second}, false},
		{"bad input", &engine.InvalidParamError{Param: "top_p", Reason: "x"}, false},
		{"context length", &engine.ContextLengthError{Model: "m", Prompt: 9, Limit: 8}, false},
		{"caller cancelled", context.Canceled, false},
		{"caller deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), false},
		{"deadline fired", &retry.DeadlineError{Kind: retry.Stall, Limit: time.Second}, false},
		{"lost after tokens", &retry.InterruptedError{Delivered: 3, Err: lost}, false},
		{"permanent lost", retry.Permanent(lost), false},
		{"exhausted", &retry.ExhaustedError{Attempts: 3, Err: lost}, false},
		{"plain error", errors.New("boom"), false},
	}
	for _, tc := range cases {
		if got := retry.Retryable(tc.err); got != tc.want {
			t.Errorf("%s: Retryable(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

func TestNewPolicyRefusesBadOptions(t *testing.T) {
	bad := []retry.Option{
		retry.WithBackoff(0, time.Second, 2),
		retry.WithBackoff(time.Millisecond, time.Second, 0.5),
		retry.WithJitter(-0.1),
		retry.WithJitter(1),
		retry.WithMaxAttempts(-1),
		retry.WithMaxElapsed(-time.Second),
		retry.WithClassifier(nil),
		retry.WithBackoff(time.Second, time.Millisecond, 2),
	}
	for i, o := range bad {
		if _, err := retry.NewPolicy(o); err == nil {
			t.Errorf("option %d: accepted", i)
		}
	}
}

func TestTrackerBackoffGrowsWithinJitter(t *testing.T) {
	p := retry.MustPolicy(retry.WithBackoff(10*time.Millisecond, 80*time.Millisecond, 2), retry.WithJitter(0.2), retry.WithMaxAttempts(0))
	tr := p.Start()
	lost := engine.ErrWorkerLost
	base := 10 * time.Millisecond
	for i := range 6 {
		d, ok := tr.Next(lost)
		if !ok {
			t.Fatalf("attempt %d refused", i)
		}
		lo, hi := time.Duration(float64(base)*0.8), time.Duration(float64(base)*1.2)+time.Microsecond
		if d < lo || d > hi {
			t.Errorf("wait %d: %v, want within [%v, %v]", i, d, lo, hi)
		}
		base = min(base*2, 80*time.Millisecond)
	}
	if tr.Attempts() != 6 {
		t.Errorf("attempts %d, want 6", tr.Attempts())
	}
}

func TestTrackerLimits(t *testing.T) {
	lost := engine.ErrWorkerLost
	tr := retry.MustPolicy(retry.WithMaxAttempts(3)).Start()
	for i := 1; i <= 3; i++ {
		_, ok := tr.Next(lost)
		if want := i < 3; ok != want {
			t.Errorf("failure %d of 3 attempts: retry %v, want %v", i, ok, want)
		}
	}
	if _, ok := retry.MustPolicy().Start().Next(errors.New("bad")); ok {
		t.Error("a non-retryable error was retried")
	}
	// The elapsed bound counts the wait about to be made.
	tr = retry.MustPolicy(retry.WithBackoff(50*time.Millisecond, time.Second, 1), retry.WithJitter(0),
		retry.WithMaxAttempts(0), retry.WithMaxElapsed(120*time.Millisecond)).Start()
	if _, ok := tr.Next(lost); !ok {
		t.Fatal("first retry refused")
	}
	time.Sleep(80 * time.Millisecond)
	if _, ok := tr.Next(lost); ok {
		t.Error("a wait past the elapsed bound was allowed")
	}
	tr.Reset()
	if _, ok := tr.Next(lost); !ok || tr.Attempts() != 1 {
		t.Errorf("after Reset: ok %v, attempts %d", ok, tr.Attempts())
	}
}

func TestRetryAfterLengthensTheWait(t *testing.T) {
	p := retry.MustPolicy(retry.WithBackoff(time.Millisecond, time.Second, 2))
	d, ok := p.Start().Next(&retry.StatusError{Code: 503, RetryAfter: 700 * time.Millisecond})
	if !ok || d != 700*time.Millisecond {
		t.Errorf("wait %v (retry %v), want the server's 700ms", d, ok)
	}
	if _, ok := retry.RetryAfter(errors.New("x")); ok {
		t.Error("RetryAfter found a hint in a plain error")
	}
}

func TestDo(t *testing.T) {
	ctx := context.Background()
	p := retry.MustPolicy(retry.WithBackoff(time.Millisecond, 5*time.Millisecond, 2), retry.WithMaxAttempts(4))
	calls := 0
	err := p.Do(ctx, func(context.Context) error {
		calls++
		if calls < 3 {
			return engine.ErrWorkerLost
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("Do: %v after %d calls, want success on the third", err, calls)
	}

	calls = 0
	err = p.Do(ctx, func(context.Context) error { calls++; return engine.ErrWorkerLost })
	var ex *retry.ExhaustedError
	if !errors.As(err, &ex) || ex.Attempts != 4 || calls != 4 || !errors.Is(err, engine.ErrWorkerLost) || retry.Retryable(err) {
		t.Fatalf("Do, always lost: %v after %d calls, want *ExhaustedError after 4", err, calls)
	}

	calls = 0
	bad := &engine.InvalidParamError{Param: "x", Reason: "y"}
	if err := p.Do(ctx, func(context.Context) error { calls++; return bad }); err != bad || calls != 1 {
		t.Fatalf("Do, bad input: %v after %d calls, want it returned at once", err, calls)
	}

	cctx, cancel := context.WithCancel(ctx)
	slow := retry.MustPolicy(retry.WithBackoff(time.Hour, time.Hour, 1))
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if err := slow.Do(cctx, func(context.Context) error { return engine.ErrWorkerLost }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Do, cancelled while waiting: %v", err)
	}
}

package wireerr_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/wireerr"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
)

// codes are retry's error codes, every one a transport may carry.
var codes = []string{
	retry.CodeInvalidValue, retry.CodeRequestTooLarge, retry.CodeUnsupportedModel, retry.CodeTemplate,
	retry.CodeExceedsKVCapacity, retry.CodeModelNotFound, retry.CodeContextLength, retry.CodeQueueFull,
	retry.CodeRateLimited, retry.CodeBudgetExhausted, retry.CodeNoBackend, retry.CodeOutOfMemory,
	retry.CodeUnavailable, retry.CodeWorkerLost, retry.CodeLoadFailed, retry.CodeFirstTokenDeadline,
	retry.CodeStallDeadline, retry.CodeTotalDeadline, retry.CodeTimeout, retry.CodeCanceled,
	retry.CodeInterrupted, retry.CodeInternal,
}

// TestEveryCodeRebuilds: the error rebuilt from each of retry's codes
// classifies with that code on the receiving side; the catch-all
// internal code, no code and a foreign code rebuild nothing, so the
// transport's own error decides.
func TestEveryCodeRebuilds(t *testing.T) {
	for _, code := range codes {
		err := wireerr.Fields{Code: code, Message: "m"}.Err()
		if code == retry.CodeInternal {
			if err != nil {
				t.Errorf("%s rebuilds %v, want nil", code, err)
			}
			continue
		}
		if got := retry.Classify(err).Code; got != code {
			t.Errorf("%s rebuilds %T classified %q", code, err, got)
		}
		if retry.KindOf(code) == retry.Internal {
			t.Errorf("%s: retry does not know the code", code)
		}
	}
	for _, code := range []string{"", "invalid_api_key"} {
		if err := (wireerr.Fields{Code: code}).Err(); err != nil {
			t.Errorf("code %q rebuilds %v, want nil", code, err)
		}
	}
}

// TestRoundTrip: what the sender's error was, the receiver's is: the same
// class, Retry-After and typed error with the numbers the wire carries.
func TestRoundTrip(t *testing.T) {
	ctxLen := &engine.ContextLengthError{Model: "m", Prompt: 10, MaxNew: 5000, Limit: 4096}
	deadline := &retry.DeadlineError{Kind: retry.Stall, Limit: time.Second, Tokens: 3}
	cases := []struct {
		err  error
		want any // a pointer to the typed error errors.As finds on both sides; nil for none
	}{
		{&engine.InvalidParamError{Param: "top_p", Reason: "3: must be in (0, 1]"}, &engine.InvalidParamError{Param: "top_p"}},
		{fmt.Errorf("wrapped: %w", ctxLen), ctxLen},
		{engine.ErrContextLength, nil},
		{&scheduler.QueueFullError{Queued: 3, MaxQueued: 3, RetryAfter: 7 * time.Second}, &scheduler.QueueFullError{}},
		{&scheduler.RateLimitError{Client: "k", RetryAfter: 2 * time.Second}, &scheduler.RateLimitError{}},
		{&scheduler.CapacityError{Model: "m", Prompt: 5, MaxNew: 9, Capacity: 8}, nil},
		{deadline, deadline},
		{&retry.DeadlineError{Kind: retry.FirstToken, Limit: time.Millisecond}, &retry.DeadlineError{Kind: retry.FirstToken}},
		{engine.ErrModelNotFound, nil},
		{engine.ErrWorkerLost, nil},
		{engine.ErrClosed, nil},
		{engine.ErrOutOfMemory, nil},
		{api.ErrUnknownTier, nil},
		{context.DeadlineExceeded, nil},
		{&retry.InterruptedError{Delivered: 2, Err: errors.New("stream broke")}, nil},
		{retry.NewError(retry.CodeLoadFailed, "load failed"), nil},
	}
	for _, c := range cases {
		f := wireerr.Of(c.err)
		got := f.Err()
		sent, rcvd := retry.Classify(c.err), retry.Classify(got)
		if sent.Kind != rcvd.Kind || sent.Code != rcvd.Code || sent.CountsAsFailure() != rcvd.CountsAsFailure() {
			t.Errorf("%v: sent as %v (counts %v), received as %v (counts %v)", c.err, sent, sent.CountsAsFailure(),
				rcvd, rcvd.CountsAsFailure())
		}
		if d, _ := retry.RetryAfter(c.err); f.RetryAfter != d {
			t.Errorf("%v: retry after %v on the wire, want %v", c.err, f.RetryAfter, d)
		}
		if c.want == nil {
			continue
		}
		target := reflect.New(reflect.TypeOf(c.want))
		if !errors.As(got, target.Interface()) {
			t.Errorf("%v: received %T, want a %T", c.err, got, c.want)
			continue
		}
		checkDetails(t, c.err, target.Elem().Interface())
	}
}

// checkDetails compares what a received typed error carries with what the
// wire is meant to carry of the sent one.
func checkDetails(t *testing.T, sent error, got any) {
	t.Helper()
	switch g := got.(type) {
	case *engine.InvalidParamError:
		if g.Param != "top_p" || g.Reason != sent.Error() {
			t.Errorf("invalid param received as %+v", g)
		}
	case *engine.ContextLengthError:
		var want *engine.ContextLengthError
		if errors.As(sent, &want); *g != *want {
			t.Errorf("context length received as %+v, want %+v", g, want)
		}
	case *retry.DeadlineError:
		var want *retry.DeadlineError
		if errors.As(sent, &want); g.Kind != want.Kind || g.Limit != want.Limit || g.Tokens != want.Tokens {
			t.Errorf("deadline received as %+v, want %+v", g, want)
		}
	case *scheduler.QueueFullError:
		if d, _ := retry.RetryAfter(sent); g.RetryAfter != d {
			t.Errorf("queue full received with retry after %v, want %v", g.RetryAfter, d)
		}
	case *scheduler.RateLimitError:
		if d, _ := retry.RetryAfter(sent); g.RetryAfter != d {
			t.Errorf("rate limit received with retry after %v, want %v", g.RetryAfter, d)
		}
	}
}

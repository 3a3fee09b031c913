package retry_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

func TestBreakerOpensHalfOpensAndCloses(t *testing.T) {
	var mu sync.Mutex
	var changes []string
	b, err := retry.NewBreaker("worker-0", retry.WithTrip(3, 0, 0), retry.WithOpenTimeout(50*time.Millisecond), retry.WithProbes(2),
		retry.OnStateChange(func(name string, from, to retry.State) {
			mu.Lock()
			changes = append(changes, fmt.Sprintf("%s:%s->%s", name, from, to))
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	lost := fmt.Errorf("w: %w", engine.ErrWorkerLost)
	// Bad input and cancellations are not the worker's failures.
	for _, e := range []error{&engine.InvalidParamError{Param: "p", Reason: "r"}, context.Canceled, nil} {
		_ = b.Do(func() error { return e })
	}
	for range 3 {
		done, err := b.Allow()
		if err != nil {
			t.Fatal(err)
		}
		done(lost)
	}
	if b.State() != retry.StateOpen {
		t.Fatalf("after 3 losses: %v", b.State())
	}
	_, err = b.Allow()
	var open *retry.OpenError
	if !errors.As(err, &open) || open.Name != "worker-0" || !errors.Is(err, retry.ErrBreakerOpen) || !retry.Retryable(err) {
		t.Fatalf("Allow while open: %v", err)
	}
	time.Sleep(60 * time.Millisecond)
	if b.State() != retry.StateHalfOpen {
		t.Fatalf("after the open timeout: %v", b.State())
	}
	d1, err1 := b.Allow()
	d2, err2 := b.Allow()
	if _, err3 := b.Allow(); err1 != nil || err2 != nil || err3 == nil {
		t.Fatalf("half-open with 2 probes: %v %v %v", err1, err2, err3)
	}
	d1(nil)
	d2(nil)
	if b.State() != retry.StateClosed {
		t.Fatalf("after 2 good probes: %v", b.State())
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"worker-0:closed->open", "worker-0:open->half-open", "worker-0:half-open->closed"}
	if fmt.Sprint(changes) != fmt.Sprint(want) {
		t.Errorf("transitions %v, want %v", changes, want)
	}
}

func TestBreakerTripsOnRatio(t *testing.T) {
	b, err := retry.NewBreaker("backend-a", retry.WithTrip(0, 4, 0.5))
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range []error{nil, &retry.StatusError{Code: 502}, nil, &retry.StatusError{Code: 500}} {
		_ = b.Do(func() error { return e })
		if want := i < 3; (b.State() == retry.StateClosed) != want {
			t.Fatalf("after %d outcomes: %v", i+1, b.State())
		}
	}
	st := b.Status()
	if st.State != retry.StateOpen || st.Name != "backend-a" {
		t.Errorf("status %+v", st)
	}
}

func TestBreakerOptionsValidated(t *testing.T) {
	for i, o := range []retry.BreakerOption{
		retry.WithTrip(0, 0, 0.5), retry.WithTrip(-1, 3, 0.5), retry.WithTrip(0, 3, 0), retry.WithTrip(0, 3, 1.5),
		retry.WithOpenTimeout(0), retry.WithProbes(0), retry.WithWindow(-1), retry.WithFailure(nil),
	} {
		if _, err := retry.NewBreaker("x", o); err == nil {
			t.Errorf("option %d accepted", i)
		}
	}
}

func TestCountsAsFailure(t *testing.T) {
	cases := map[string]struct {
		err  error
		want bool
	}{
		"lost":             {engine.ErrWorkerLost, true},
		"503":              {&retry.StatusError{Code: 503}, true},
		"429":              {&retry.StatusError{Code: 429, RetryAfter: time.Second}, false},
		"stall":            {&retry.DeadlineError{Kind: retry.Stall}, true},
		"ttft":             {&retry.DeadlineError{Kind: retry.FirstToken}, false},
		"interrupted lost": {&retry.InterruptedError{Delivered: 2, Err: engine.ErrWorkerLost}, true},
		"cancel":           {context.Canceled, false},
		"bad input":        {engine.ErrInvalidParam, false},
		"open":             {retry.ErrBreakerOpen, false},
	}
	for name, tc := range cases {
		if got := retry.CountsAsFailure(tc.err); got != tc.want {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
}

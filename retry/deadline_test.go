package retry_test

import (
	"errors"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/retry"
)

// watch runs a Watch and returns the error it fired, or nil after wait.
func watch(d retry.Deadlines, tokens []time.Duration, wait time.Duration) *retry.DeadlineError {
	fired := make(chan *retry.DeadlineError, 1)
	w := retry.NewWatch(d, time.Now(), func(e *retry.DeadlineError) { fired <- e })
	defer w.Stop()
	start := time.Now()
	for _, at := range tokens {
		time.Sleep(time.Until(start.Add(at)))
		select {
		case e := <-fired:
			return e
		default:
		}
		w.Token()
	}
	select {
	case e := <-fired:
		return e
	case <-time.After(wait):
		return nil
	}
}

func TestWatchFiresEachDeadline(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name   string
		d      retry.Deadlines
		tokens []time.Duration
		want   retry.DeadlineKind // 0: none
	}{
		{"first token late", retry.Deadlines{FirstToken: 30 * ms}, []time.Duration{80 * ms}, retry.FirstToken},
		{"first token in time", retry.Deadlines{FirstToken: 300 * ms}, []time.Duration{10 * ms, 20 * ms}, 0},
		{"stall", retry.Deadlines{Stall: 60 * ms}, []time.Duration{0, 10 * ms, 20 * ms, 250 * ms}, retry.Stall},
		{"steady tokens", retry.Deadlines{Stall: 150 * ms}, []time.Duration{0, 20 * ms, 40 * ms, 60 * ms, 80 * ms, 100 * ms, 120 * ms}, 0},
		{"total", retry.Deadlines{Total: 50 * ms, Stall: time.Second}, []time.Duration{0, 20 * ms, 40 * ms, 60 * ms, 80 * ms}, retry.Total},
		{"none", retry.Deadlines{}, []time.Duration{0, 50 * ms}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wait := 100 * ms
			if tc.d.Stall > 0 && tc.want == 0 {
				wait = tc.d.Stall / 2 // the stream ends before the next gap runs out
			}
			e := watch(tc.d, tc.tokens, wait)
			switch {
			case tc.want == 0 && e != nil:
				t.Fatalf("fired %v", e)
			case tc.want != 0 && (e == nil || e.Kind != tc.want):
				t.Fatalf("fired %v, want %v", e, tc.want)
			case e != nil && (!errors.Is(e, retry.ErrDeadline) || retry.Retryable(e)):
				t.Fatalf("%v: want ErrDeadline, not retryable", e)
			}
		})
	}
}

func TestWatchStopPreventsFiring(t *testing.T) {
	fired := make(chan *retry.DeadlineError, 1)
	w := retry.NewWatch(retry.Deadlines{FirstToken: 20 * time.Millisecond, Total: 20 * time.Millisecond}, time.Now(), func(e *retry.DeadlineError) { fired <- e })
	w.Stop()
	w.Stop()
	select {
	case e := <-fired:
		t.Fatalf("fired after Stop: %v", e)
	case <-time.After(60 * time.Millisecond):
	}
	var nilWatch *retry.Watch
	nilWatch.Token()
	nilWatch.Stop()
	if err := (retry.Deadlines{Stall: -1}).Validate(); err == nil {
		t.Error("negative stall accepted")
	}
}

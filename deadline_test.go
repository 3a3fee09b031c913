package mlxserving_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/retry"
)

// TestDeadlines: each deadline ends its request with a DeadlineError that
// names it, and the sequence's KV is freed within a step.
func TestDeadlines(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name     string
		step     time.Duration
		server   retry.Deadlines
		request  retry.Deadlines
		want     retry.DeadlineKind
		atLeast  int // tokens the caller got before it fired
		atMostOf int
	}{
		{"first token", 80 * ms, retry.Deadlines{}, retry.Deadlines{FirstToken: 20 * ms}, retry.FirstToken, 0, 0},
		{"stall", 60 * ms, retry.Deadlines{Stall: 25 * ms}, retry.Deadlines{}, retry.Stall, 1, 1},
		{"total", 5 * ms, retry.Deadlines{Total: 10 * time.Second}, retry.Deadlines{Total: 60 * ms}, retry.Total, 1, 50},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, []enginetest.SimOption{enginetest.WithStepTime(tc.step, 0)}, mlxserving.WithDeadlines(tc.server))
			r := req(200, 1, 2, 3)
			r.Deadlines = tc.request
			st, err := f.srv.Generate(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for {
				c, err := st.Recv()
				if err == nil {
					if c.HasToken {
						n++
					}
					continue
				}
				var de *retry.DeadlineError
				if !errors.As(err, &de) || de.Kind != tc.want || retry.Retryable(err) {
					t.Fatalf("stream ended with %v, want a %v DeadlineError", err, tc.want)
				}
				break
			}
			if n < tc.atLeast || n > tc.atMostOf {
				t.Errorf("%d tokens before the deadline, want %d to %d", n, tc.atLeast, tc.atMostOf)
			}
			waitFor(t, "KV freed", func() bool { return f.sim.Stats().OpenSequences == 0 })
		})
	}
}

func TestDeadlinesValidated(t *testing.T) {
	if _, err := mlxserving.New(nil, mlxserving.WithDeadlines(retry.Deadlines{Stall: -1})); err == nil {
		t.Error("negative server deadline accepted")
	}
	f := newFixture(t, nil)
	r := req(4, 1, 2)
	r.Deadlines.Total = -time.Second
	if _, err := f.srv.Generate(context.Background(), r); err == nil {
		t.Error("negative request deadline accepted")
	}
}

// TestDeadlineAnswersDuringAStep: a deadline that passes while a long step
// (a cold prefill) runs answers the caller at once; the sequence is freed
// when the step ends.
func TestDeadlineAnswersDuringAStep(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithStepTime(3*time.Second, 0)})
	r := req(8, 1, 2, 3)
	r.Deadlines = retry.Deadlines{FirstToken: 20 * time.Millisecond}
	start := time.Now()
	st, err := f.srv.Generate(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Recv()
	var de *retry.DeadlineError
	if !errors.As(err, &de) || de.Kind != retry.FirstToken {
		t.Fatalf("stream ended with %v, want a first-token DeadlineError", err)
	}
	// Far below the step: the answer did not wait for it.
	if took := time.Since(start); took > time.Second {
		t.Fatalf("answered %v after the request, with a 20ms deadline inside a 3s step", took)
	}
	waitFor(t, "KV freed", func() bool { return f.sim.Stats().OpenSequences == 0 })
}

package pyproc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

// TestTraceOnDemand: Engine.Trace traces the steps that come after it,
// while a sequence decodes, and returns the worker's trace and summary
// once written; a trace whose caller gives up before any step ends at
// the worker, which says so and then takes the next; a worker tracing
// already refuses another as invalid.
func TestTraceOnDemand(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tiny(t))
	dir := filepath.Join(t.TempDir(), "traces")

	// No steps: the caller's deadline ends it, and the worker's trace too,
	// which answers that it recorded nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	early, err := e.Trace(ctx, dir, 5)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || len(early) != 1 || early[0].File != "" ||
		!strings.HasSuffix(early[0].Summary, "-1: stopped before its first step") {
		t.Fatalf("a trace without steps: %+v, %v; want the deadline and a trace that stopped before its first step", early, err)
	}

	type result struct {
		traces []DeviceTrace
		err    error
	}
	done := make(chan result, 1)
	go func() {
		tr, err := e.Trace(context.Background(), dir, 5)
		done <- result{tr, err}
	}()
	// Step until the trace is written.
	ctx = context.Background()
	feed := openFeed(t, m, 1, []int32{1, 2, 3, 4, 5})
	defer m.Free(1, "")
	var got result
	for steps := 0; ; steps++ {
		select {
		case got = <-done:
		default:
			if steps > 2000 {
				t.Fatal("no trace after 2,000 steps")
			}
			o, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: feed, Sample: true, Params: greedy}})
			if err != nil {
				t.Fatal(err)
			}
			feed = []int32{o[0].Token}
			if steps == 200 { // the sequence nears its context: a fresh one
				m.Free(1, "")
				feed = openFeed(t, m, 1, []int32{1, 2, 3, 4, 5})
			}
			continue
		}
		break
	}
	if got.err != nil {
		t.Fatal(got.err)
	}
	if len(got.traces) != 1 {
		t.Fatalf("%d traces, want one a worker", len(got.traces))
	}
	tr := got.traces[0]
	if tr.Worker != 0 || filepath.Dir(tr.File) != dir || !strings.HasSuffix(tr.File, "-2.json.gz") {
		t.Errorf("trace %+v: want worker 0's second trace in %s", tr, dir)
	}
	if _, err := os.Stat(tr.File); err != nil {
		t.Error(err)
	}
	if !strings.Contains(tr.Summary, ": 5 steps over") || !strings.Contains(tr.Summary, "no device events (a CPU worker)") {
		t.Errorf("summary %q: want 5 steps on the CPU", tr.Summary)
	}
	txt, err := os.ReadFile(strings.TrimSuffix(tr.File, ".json.gz") + ".txt")
	if err != nil || strings.TrimSpace(string(txt)) != tr.Summary {
		t.Errorf("the summary file: %q, %v; want the summary", txt, err)
	}

	for _, n := range []int{-1, MaxTraceSteps + 1} {
		if _, err := e.Trace(ctx, dir, n); err == nil {
			t.Errorf("a trace of %d steps accepted", n)
		}
	}

	// A worker whose start-up trace waits for its steps refuses another.
	busy := newEngine(t, WithTuning(Tuning{TraceDir: dir, TraceSkip: 1000, TraceSteps: 5}))
	_, err = busy.Trace(ctx, dir, 5)
	var we *WorkerError
	if !errors.Is(err, engine.ErrInvalidParam) || !errors.As(err, &we) || !strings.Contains(we.Message, "under way") {
		t.Errorf("a trace beside another: %v, want it refused as under way", err)
	}
}

package pyproc

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/syncbuf"
)

// TestWorkerLogsIdleSummary: a real worker that stops stepping logs its
// step-cycle summary within seconds (an idle spell ends the window), over
// exactly the steps it ran, rather than waiting for the next step past
// its 10 s interval.
func TestWorkerLogsIdleSummary(t *testing.T) {
	var logs syncbuf.Buffer
	// Lookahead off: on CUDA the worker would decode 8 tokens a request,
	// and the summary counts the worker's steps, not the engine's.
	e := newEngine(t, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), WithLookahead(1))
	m := load(t, e, tiny(t))
	ctx := context.Background()
	if _, err := m.Open(ctx, 1, []int32{5, 6, 7}, ""); err != nil {
		t.Fatal(err)
	}
	defer m.Free(1, "")
	in := []engine.StepInput{{Seq: 1, Tokens: []int32{5, 6, 7}, Sample: true, Params: greedy}}
	const steps = 6
	for range steps {
		out, err := m.Step(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		in[0].Tokens = []int32{out[0].Token}
	}
	want := fmt.Sprintf("timing: steps: %d in ", steps)
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), want); {
		if time.Now().After(deadline) {
			t.Fatalf("no summary of %d steps logged 10 s after the last; the log:\n%s", steps, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

package pyproc

import (
	"context"
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// inject sends a fault request (PROTOCOL.md, test hook) to worker i.
func inject(t *testing.T, e *Engine, i int, fields map[string]any) *proc {
	t.Helper()
	p, err := e.slots[i].current(context.Background(), e.closing)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.send(request("fault", fields), false); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestFaults breaks worker 0 in each way a worker can break while a
// sequence is stepping on it, and checks: the step fails with a typed
// retryable error, a sequence on worker 1 carries on undisturbed, and
// worker 0 is replaced by a fresh process that serves the model again.
func TestFaults(t *testing.T) {
	cases := []struct {
		name   string
		break_ func(t *testing.T, e *Engine) *proc
		reason string
	}{
		{"kill -9 mid-step", func(t *testing.T, e *Engine) *proc {
			p := inject(t, e, 0, map[string]any{"kind": "step_delay", "seconds": 2})
			go func() {
				time.Sleep(300 * time.Millisecond)
				_ = syscall.Kill(p.pid(), syscall.SIGKILL)
			}()
			return p
		}, "signal: killed"},
		{"heartbeat stops mid-step", func(t *testing.T, e *Engine) *proc {
			inject(t, e, 0, map[string]any{"kind": "step_delay", "seconds": 5})
			return inject(t, e, 0, map[string]any{"kind": "stop_heartbeat"})
		}, "heartbeat lost"},
		{"garbage on stdout", func(t *testing.T, e *Engine) *proc {
			inject(t, e, 0, map[string]any{"kind": "step_delay", "seconds": 1})
			return inject(t, e, 0, map[string]any{"kind": "garbage"})
		}, "unreadable line"},
		{"over-long line on stdout", func(t *testing.T, e *Engine) *proc {
			inject(t, e, 0, map[string]any{"kind": "step_delay", "seconds": 1})
			return inject(t, e, 0, map[string]any{"kind": "longline", "bytes": 200 << 10})
		}, "exceeds the limit"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, WithWorkers(2), withFaults(), WithHeartbeat(100*time.Millisecond, 3*time.Second), WithMaxLineBytes(64<<10))
			m := load(t, e, tiny(t))
			ctx := context.Background()
			pa, pb := prompt(1, 12), prompt(2, 9)
			wantA, wantB := generate(t, m, 100, pa, 1), generate(t, m, 101, pb, 6)
			if _, err := m.Open(ctx, 1, pa, ""); err != nil { // worker 0
				t.Fatal(err)
			}
			if _, err := m.Open(ctx, 2, pb, ""); err != nil { // worker 1
				t.Fatal(err)
			}
			if m.seqs[1].slot.idx != 0 || m.seqs[2].slot.idx != 1 {
				t.Fatalf("routing put the sequences on workers %d and %d", m.seqs[1].slot.idx, m.seqs[2].slot.idx)
			}
			gotB := stepOne(t, m, 2, pb, nil)
			old := tc.break_(t, e)
			_, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: pa, Sample: true, Params: greedy}})
			var lost *LostError
			if !errors.Is(err, engine.ErrWorkerLost) || !errors.As(err, &lost) || !retry.Retryable(err) {
				t.Fatalf("step on the broken worker: %v, want a *LostError", err)
			}
			if !strings.Contains(lost.Reason, tc.reason) {
				t.Errorf("reason %q, want it to mention %q", lost.Reason, tc.reason)
			}
			m.Free(1, "")
			for len(gotB) < 6 { // the other worker's sequence carries on
				gotB = stepOne(t, m, 2, gotB[len(gotB)-1:], gotB)
			}
			m.Free(2, "")
			if !slices.Equal(gotB, wantB) {
				t.Errorf("sequence on the healthy worker: %v, want %v", gotB, wantB)
			}
			waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			fresh, err := e.slots[0].current(waitCtx, e.closing)
			if err != nil || fresh == old || fresh.pid() == old.pid() {
				t.Fatalf("worker 0 not replaced: %v", err)
			}
			if w := e.Workers(); w[0].Restarts != 1 || w[1].Restarts != 0 || w[0].PID != fresh.pid() {
				t.Errorf("workers after one loss: %+v", w)
			}
			// The retried sequence lands on the fresh worker and gets its tokens.
			if got := generate(t, m, 3, pa, 1); !slices.Equal(got, wantA) {
				t.Errorf("retry on the fresh worker: %v, want %v", got, wantA)
			}
		})
	}
}

func stepOne(t *testing.T, m *Model, seq engine.SeqID, feed, acc []int32) []int32 {
	t.Helper()
	o, err := m.Step(context.Background(), []engine.StepInput{{Seq: seq, Tokens: feed, Sample: true, Params: greedy}})
	if err != nil {
		t.Fatal(err)
	}
	return append(acc, o[0].Token)
}

// TestOversizeRequest sends a step whose request line exceeds the limit:
// it is refused before it is sent, with a typed error, and the worker and
// its other sequences carry on.
func TestOversizeRequest(t *testing.T) {
	e := newEngine(t, WithMaxLineBytes(4096))
	m := load(t, e, tiny(t))
	ctx := context.Background()
	for i := 1; i <= 3; i++ {
		if _, err := m.Open(ctx, engine.SeqID(i), prompt(i, 500), ""); err != nil {
			t.Fatal(err)
		}
	}
	batch := []engine.StepInput{{Seq: 1, Tokens: prompt(1, 500)}, {Seq: 2, Tokens: prompt(2, 500)}, {Seq: 3, Tokens: prompt(3, 500)}}
	_, err := m.Step(ctx, batch)
	var ipe *engine.InvalidParamError
	if !errors.As(err, &ipe) || !strings.Contains(ipe.Reason, "line limit") {
		t.Fatalf("oversize step: %v, want an InvalidParamError about the line limit", err)
	}
	if _, err := m.Step(ctx, batch[:1]); err != nil {
		t.Fatalf("the same worker after the refusal: %v", err)
	}
	for i := 1; i <= 3; i++ {
		m.Free(engine.SeqID(i), "")
	}
}

// TestCloseDrains closes the engine while a step is running: the step
// completes, and Close returns only once the worker process is gone.
func TestCloseDrains(t *testing.T) {
	e := newEngine(t, withFaults())
	m := load(t, e, tiny(t))
	ctx := context.Background()
	if _, err := m.Open(ctx, 1, prompt(1, 4), ""); err != nil {
		t.Fatal(err)
	}
	p := inject(t, e, 0, map[string]any{"kind": "step_delay", "seconds": 0.5})
	done := make(chan error, 1)
	go func() {
		_, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: prompt(1, 4), Sample: true, Params: greedy}})
		done <- err
	}()
	for inFlight := 0; inFlight == 0; time.Sleep(10 * time.Millisecond) { // wait until the step is sent
		p.pmu.Lock()
		inFlight = len(p.pending)
		p.pmu.Unlock()
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if alive(p.pid()) {
		t.Errorf("worker %d still runs after Close returned", p.pid())
	}
	if err := <-done; err != nil {
		t.Errorf("the step in flight at Close: %v, want it completed", err)
	}
	if _, err := m.Open(ctx, 2, prompt(1, 4), ""); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("Open after Close: %v", err)
	}
}

// TestBusyWorkerIsNotKilledForSilence: a worker whose heartbeat is starved
// while it works (the kernel shows it running) is not killed at the
// heartbeat timeout, only past busyLimit timeouts; an idle silent one is.
func TestBusyWorkerIsNotKilledForSilence(t *testing.T) {
	if _, ok := readCPUState(1); !ok {
		t.Skip("no /proc: the watchdog goes by heartbeats alone here")
	}
	e := newEngine(t, withFaults(), WithHeartbeat(100*time.Millisecond, 500*time.Millisecond))
	m := load(t, e, tiny(t))
	want := generate(t, m, 1, prompt(1, 8), 3)
	before := e.Workers()[0].PID
	inject(t, e, 0, map[string]any{"kind": "spin", "seconds": 1.2}) // 2.4 timeouts, under busyLimit
	if got := generate(t, m, 2, prompt(1, 8), 3); !slices.Equal(got, want) {
		t.Fatalf("after a busy silence: %v, want %v", got, want)
	}
	if w := e.Workers()[0]; w.PID != before || w.Restarts != 0 {
		t.Fatalf("a busy worker silent for 1.2s (timeout 0.5s) was replaced: %+v", w)
	}
	old := inject(t, e, 0, map[string]any{"kind": "spin", "seconds": 5}) // past busyLimit timeouts
	select {
	case <-old.dead:
	case <-time.After(20 * time.Second):
		t.Fatal("a worker silent past busyLimit timeouts was not killed")
	}
	if !strings.Contains(old.reason, "while busy") {
		t.Errorf("reason %q, want it to say the worker was busy", old.reason)
	}
}

// TestShutdownWithoutKill: closing an engine with an idle worker lets the
// worker exit by itself at once; it is not killed, for a lost heartbeat or
// for outliving the shutdown grace.
func TestShutdownWithoutKill(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := New(ctx, WithPython(python(t)), WithHeartbeat(50*time.Millisecond, 300*time.Millisecond), WithCacheDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	p, err := e.slots[0].current(ctx, e.closing)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	<-p.dead
	if strings.Contains(p.reason, "heartbeat") || strings.Contains(p.reason, "did not exit") {
		t.Fatalf("the worker was killed at shutdown: %s", p.reason)
	}
}

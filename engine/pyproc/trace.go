package pyproc

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"time"
)

// DefaultTraceSteps is the steps a device trace records when none are
// asked for.
const DefaultTraceSteps = 200

// DeviceTrace is one worker's device trace (Engine.Trace).
type DeviceTrace struct {
	// Worker is the worker's index in the pool (WorkerInfo.Index).
	Worker int
	// File is the trace: trace-<pid>-<n>.json.gz, a Chrome trace that
	// Perfetto opens; "" when the trace was stopped before its first step.
	File string
	// Summary says where the device idled over the traced steps: its busy
	// share (the union of its kernels, as nvidia-smi counts), its idle
	// gaps by length, the worker's phase in each idle moment (waiting for
	// the next request, working on a step on the host, waiting for the
	// device) and the largest gaps with the kernels around them. Also
	// beside File as trace-<pid>-<n>.txt and in the worker's log.
	Summary string
}

// traceStopWait bounds the wait for a worker's trace once it was told to
// stop: its answer comes as soon as it has written what it recorded,
// which takes seconds for a long trace.
const traceStopWait = 2 * time.Minute

// MaxTraceSteps is the most steps one trace records (the worker's
// trace.MAX_STEPS): the profiler holds every event until the trace is
// written, and the worker stalls for a time that grows with them.
const MaxTraceSteps = 2000

// Trace records the next steps steps (0: DefaultTraceSteps) of every
// worker with torch's profiler, the device's kernels and copies beside the
// worker's phases, writes each worker's trace into dir (made if missing)
// and returns them, in worker order, once all are written. The traced
// steps' host work is slower (every host op is recorded), and each worker
// stalls while its trace is written. It is the on-demand form of
// Tuning.TraceDir, for a load already running: the steps are the load's,
// so a worker's trace ends only once it has stepped that often. When ctx
// ends first, every worker's trace ends where it is and Trace returns
// them as written then (one that had not reached its first step has no
// File), with ctx's error. A worker already tracing refuses with a
// *WorkerError wrapping engine.ErrInvalidParam; one whose Python has no
// torch, with one wrapping engine.ErrUnavailable; Trace then returns that
// error, and the other workers' traces, ended where they were. Under
// tensor parallel a worker's trace is its rank 0's.
func (e *Engine) Trace(ctx context.Context, dir string, steps int) ([]DeviceTrace, error) {
	if steps < 0 || steps > MaxTraceSteps {
		return nil, fmt.Errorf("pyproc: Trace: steps %d: want 0 (%d) to %d", steps, DefaultTraceSteps, MaxTraceSteps)
	}
	if steps == 0 {
		steps = DefaultTraceSteps
	}
	if dir == "" {
		return nil, fmt.Errorf("pyproc: Trace: no directory")
	}
	abs, err := filepath.Abs(dir) // the workers' working directory need not be this process's
	if err != nil {
		return nil, fmt.Errorf("pyproc: Trace: directory %q: %w", dir, err)
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make([]DeviceTrace, len(e.slots))
	errs := make([]error, len(e.slots))
	var wg sync.WaitGroup
	for i, s := range e.slots {
		wg.Go(func() {
			out[i], errs[i] = e.traceWorker(ctx, s, abs, steps)
			if errs[i] != nil && ctx.Err() == nil {
				cancel() // a failure: the others end where they are
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && err != ctx.Err() { // a failure, not an end it caused
			return out, err
		}
	}
	return out, parent.Err()
}

// traceWorker arms one worker's trace and waits for its answer, which the
// worker sends once the trace is written. When ctx ends first it tells
// the worker to end the trace now and waits (traceStopWait at most) for
// what it wrote, returned with ctx's error.
func (e *Engine) traceWorker(ctx context.Context, s *slot, dir string, steps int) (DeviceTrace, error) {
	tr := DeviceTrace{Worker: s.idx}
	p, err := s.current(ctx, e.closing)
	if err != nil {
		return tr, err
	}
	id, ch, err := p.send(request("trace", map[string]any{"dir": dir, "steps": steps}), true)
	if err != nil {
		return tr, err
	}
	// The answer is awaited past ctx's end: told to stop, the worker
	// answers with what it recorded.
	wait, stopWaiting := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWaiting()
	answered := make(chan struct{})
	defer close(answered)
	go func() {
		select {
		case <-ctx.Done():
			// Naming the trace: one another caller armed is not ended.
			_, _, _ = p.send(request("trace", map[string]any{"stop": true, "trace": id}), false)
			t := time.NewTimer(traceStopWait)
			defer t.Stop()
			select {
			case <-t.C:
				stopWaiting()
			case <-answered:
			}
		case <-answered:
		}
	}()
	r, err := p.wait(wait, "", id, ch)
	if err != nil {
		if wait.Err() != nil { // no answer within traceStopWait of the stop
			return tr, ctx.Err()
		}
		return tr, err // the worker's refusal, or its loss
	}
	tr.File, tr.Summary = r.File, r.Summary
	return tr, ctx.Err()
}

package pyproc

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
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

// Trace records the next steps steps (0: DefaultTraceSteps) of every
// worker with torch's profiler, the device's kernels and copies beside the
// worker's phases, writes each worker's trace into dir (made if missing)
// and returns them once all are written. The traced steps' host work is
// slower (every host op is recorded), and each worker stalls while its
// trace is written. It is the on-demand form of Tuning.TraceDir, for a
// load already running: the steps are the load's, so Trace returns only
// once the engine has stepped that often. When ctx ends first, each
// worker's trace ends where it is (its files written, if it recorded a
// step) and Trace returns ctx's error. A worker already tracing refuses
// with a *WorkerError wrapping engine.ErrInvalidParam; one whose Python
// has no torch, with one wrapping engine.ErrUnavailable.
func (e *Engine) Trace(ctx context.Context, dir string, steps int) ([]DeviceTrace, error) {
	if steps < 0 {
		return nil, fmt.Errorf("pyproc: Trace: steps %d: want 0 (%d) or more", steps, DefaultTraceSteps)
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
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make([]DeviceTrace, len(e.slots))
	errs := make([]error, len(e.slots))
	var wg sync.WaitGroup
	for i, s := range e.slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = e.traceWorker(ctx, s, abs, steps)
			if errs[i] != nil {
				cancel() // the others stop where they are
			}
		}()
	}
	wg.Wait()
	// The cause, not the cancellations it caused.
	var first error
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return nil, err
		}
		if first == nil {
			first = err
		}
	}
	if first != nil {
		return nil, first
	}
	return out, nil
}

// traceWorker arms one worker's trace and waits for its reply, which the
// worker sends once the trace is written; when ctx ends first it tells the
// worker to end the trace.
func (e *Engine) traceWorker(ctx context.Context, s *slot, dir string, steps int) (DeviceTrace, error) {
	p, err := s.current(ctx, e.closing)
	if err != nil {
		return DeviceTrace{}, err
	}
	r, err := p.call(ctx, "", request("trace", map[string]any{"dir": dir, "steps": steps}))
	if err != nil {
		if ctx.Err() != nil {
			// Unanswered now: its answer, when the worker writes what it
			// recorded, is dropped.
			_, _, _ = p.send(request("trace", map[string]any{"stop": true}), false)
		}
		return DeviceTrace{}, err
	}
	return DeviceTrace{Worker: s.idx, File: r.File, Summary: r.Summary}, nil
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/pyproc"
)

// traceReply is /debug/trace's answer: one trace per worker of each
// replica; Complete is false when the timeout ended them first.
type traceReply struct {
	Traces   []replicaTrace `json:"traces"`
	Complete bool           `json:"complete"`
}

// defaultTraceTimeout is how long /debug/trace waits for its steps unless
// the request says (timeout=): then every trace ends where it is.
const defaultTraceTimeout = time.Minute

type replicaTrace struct {
	Replica int    `json:"replica"`
	Worker  int    `json:"worker"`
	File    string `json:"file,omitempty"`
	Summary string `json:"summary"`
}

// traceHandler answers POST /debug/trace?steps=N&timeout=D (defaults
// pyproc.DefaultTraceSteps and defaultTraceTimeout): every worker of
// every replica traces its next N steps into dir (pyproc.Engine.Trace),
// and the answer, once all are written, lists each trace's file and
// summary. At the timeout, or when the caller goes away, the traces end
// where they are; the answer then says complete false. engines must be
// the Python engine's.
func traceHandler(engines []*pyproc.Engine, dir string) http.Handler {
	// One trace at a time: a second would arm some workers before the
	// first's refusal, and both would fail.
	var tracing sync.Mutex
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !tracing.TryLock() {
			traceError(w, http.StatusConflict, "a trace is under way")
			return
		}
		defer tracing.Unlock()
		q := r.URL.Query()
		steps := pyproc.DefaultTraceSteps
		if s := q.Get("steps"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > pyproc.MaxTraceSteps {
				traceError(w, http.StatusBadRequest, fmt.Sprintf("steps %q: want 1 to %d", s, pyproc.MaxTraceSteps))
				return
			}
			steps = n
		}
		timeout := defaultTraceTimeout
		if s := q.Get("timeout"); s != "" {
			d, err := time.ParseDuration(s)
			if err != nil || d <= 0 || d > time.Hour {
				traceError(w, http.StatusBadRequest, fmt.Sprintf("timeout %q: want a duration up to 1h, e.g. 90s", s))
				return
			}
			timeout = d
		}
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		type result struct {
			replica int
			traces  []pyproc.DeviceTrace
			err     error
		}
		results := make(chan result, len(engines))
		for i, e := range engines {
			go func() {
				tr, err := e.Trace(ctx, dir, steps)
				results <- result{i, tr, err}
			}()
		}
		byReplica := make([][]pyproc.DeviceTrace, len(engines))
		reply := traceReply{Complete: true}
		var failed error
		for range engines {
			res := <-results
			byReplica[res.replica] = res.traces
			switch {
			case res.err == nil:
			case res.err == ctx.Err(): // ended early: what they recorded
				reply.Complete = false
			case failed == nil:
				failed = res.err
				cancel() // the other replicas' traces end where they are
			}
		}
		for i, trs := range byReplica {
			for _, t := range trs {
				reply.Traces = append(reply.Traces, replicaTrace{Replica: i, Worker: t.Worker, File: t.File, Summary: t.Summary})
			}
		}
		switch {
		case r.Context().Err() != nil: // the caller is gone
		case failed == nil:
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(reply)
		case errors.Is(failed, engine.ErrInvalidParam):
			traceError(w, http.StatusConflict, failed.Error())
		default:
			traceError(w, http.StatusInternalServerError, failed.Error())
		}
	})
}

func traceError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"message": msg, "type": "trace_error"}})
}

// pythonEngines returns the replicas' engines as the Python engine's, or
// an error naming the flag when one is not.
func pythonEngines(engines []engine.Engine) ([]*pyproc.Engine, error) {
	out := make([]*pyproc.Engine, len(engines))
	for i, e := range engines {
		p, ok := e.(*pyproc.Engine)
		if !ok {
			return nil, fmt.Errorf("-trace-dir: device traces are the python engine's, not %s's", e.Name())
		}
		out[i] = p
	}
	return out, nil
}

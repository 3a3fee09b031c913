package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/pyproc"
)

// maxTraceSteps bounds the steps one /debug/trace request records: each
// step's host ops and kernels stay in the profiler's memory until the
// trace is written.
const maxTraceSteps = 10000

// traceReply is /debug/trace's answer: one trace per worker of each
// replica.
type traceReply struct {
	Traces []replicaTrace `json:"traces"`
}

type replicaTrace struct {
	Replica int    `json:"replica"`
	Worker  int    `json:"worker"`
	File    string `json:"file,omitempty"`
	Summary string `json:"summary"`
}

// traceHandler answers POST /debug/trace?steps=N (default
// pyproc.DefaultTraceSteps): every worker of every replica traces its
// next N steps into dir (pyproc.Engine.Trace), and the answer, once all
// are written, lists each trace's file and summary. The caller's going
// away ends the traces where they are. engines must be the Python
// engine's.
func traceHandler(engines []*pyproc.Engine, dir string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		steps := pyproc.DefaultTraceSteps
		if s := r.URL.Query().Get("steps"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > maxTraceSteps {
				traceError(w, http.StatusBadRequest, fmt.Sprintf("steps %q: want 1 to %d", s, maxTraceSteps))
				return
			}
			steps = n
		}
		type result struct {
			traces []pyproc.DeviceTrace
			err    error
		}
		results := make([]chan result, len(engines))
		for i, e := range engines {
			results[i] = make(chan result, 1)
			go func() {
				tr, err := e.Trace(r.Context(), dir, steps)
				results[i] <- result{tr, err}
			}()
		}
		var reply traceReply
		var failed error
		for i := range engines {
			res := <-results[i]
			if res.err != nil && failed == nil {
				failed = res.err
			}
			for _, t := range res.traces {
				reply.Traces = append(reply.Traces, replicaTrace{Replica: i, Worker: t.Worker, File: t.File, Summary: t.Summary})
			}
		}
		switch {
		case failed == nil:
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(reply)
		case r.Context().Err() != nil: // the caller is gone
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

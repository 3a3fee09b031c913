// Package pyproc is the Python-subprocess engine: a pool of supervised
// Python worker processes that run models for the serving layer.
//
// The runtime's Python files are embedded in this package and written at
// start to a cache directory named by their content hash, so `go get` is
// all a program needs besides a Python interpreter with PyTorch (Debian:
// apt-get install python3-torch python3-numpy) or MLX (pip install mlx-lm).
// Workers speak one JSON object per line over stdin/stdout (PROTOCOL.md);
// the supervisor checks their heartbeats, fails the sequences of a worker
// that dies with an error wrapping engine.ErrWorkerLost, and restarts it
// under a retry.Policy (exponential backoff with jitter; WithRestartPolicy).
// Sequences go to the least-loaded worker whose circuit breaker admits
// them (WithBreaker: a worker that keeps losing its sequences is avoided
// until its breaker's probes succeed) and stay there.
//
// On CUDA the torch backend decodes ahead: a decode step asks the worker
// for 8 tokens per sequence (WithLookahead), which it produces as chained
// CUDA-graph replays with Triton kernels for attention, the rotary
// embedding and the fused norms, and Step hands them out without a round
// trip per token; stop conditions stay the caller's, at the cost of at
// most 7 wasted tokens per finished sequence. On the CPU (and for the
// repetition penalty) every token is one round trip.
//
// Use:
//
//	eng, err := pyproc.New(ctx, pyproc.WithPython("/usr/bin/python3"), pyproc.WithWorkers(2))
//	defer eng.Close()
//	m, err := eng.Load(ctx, engine.ModelSpec{ID: "llama", Path: dir})
//	reused, err := m.Open(ctx, 1, prompt, "")
//	out, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: prompt, Sample: true, Params: &engine.SamplingParams{}}})
package pyproc

// Package pyproc is the Python-subprocess engine: a pool of supervised
// Python worker processes that run models for the serving layer.
//
// The runtime's Python files are embedded in this package and written at
// start to a cache directory named by their content hash, so `go get` is
// all a program needs besides a Python interpreter with PyTorch (Debian:
// apt-get install python3-torch python3-numpy) or MLX (pip install mlx-lm).
// That directory is created 0700 and checked before every worker start:
// owned by this user, nobody else may write it, and it holds exactly the
// embedded files with the embedded content; otherwise the start fails with
// a *RuntimeDirError (ErrUnsafeRuntime). Checkpoints are treated as
// untrusted: the runtime checks every safetensors header and config.json
// bound before it reads a weight, and refuses a bad one with an
// *engine.CheckpointError.
// Workers speak one JSON object per line over stdin/stdout (PROTOCOL.md);
// the supervisor checks their heartbeats, fails the sequences of a worker
// that dies with an error wrapping engine.ErrWorkerLost, and restarts it
// under a retry.Policy (exponential backoff with jitter; WithRestartPolicy).
// A sequence whose prefix key names KV saved on a worker goes to that
// worker unless it carries more than 1.25 times the pool's mean load
// (bounded-load affinity), its KV pool lacks the blocks for the prompt,
// or its circuit breaker refuses; otherwise, and without a key, it goes
// to the least-loaded worker whose circuit breaker admits it, those with
// the blocks for the prompt first. It stays there. A worker's blocks are
// those its last reply reported free less those the unfed prompts of its
// open sequences will take: the batcher admits by the sum of the
// workers' pools, and a worker without the blocks would refuse the
// sequence's steps while another has room. WithBreaker: a worker that
// keeps losing its sequences is avoided until its breaker's probes
// succeed. Models
// implement engine.SavedKV: keys evicted by a worker, or lost with it, are
// reported.
//
// On CUDA the torch backend decodes ahead: a decode step asks the worker
// for 8 tokens per sequence (WithLookahead), which it produces as chained
// CUDA-graph replays with Triton kernels for attention, the rotary
// embedding and the fused norms, and Step hands them out without a round
// trip per token; stop conditions stay the caller's, at the cost of at
// most 7 wasted tokens per finished sequence. On the CPU (and for the
// repetition penalty) every token is one round trip. A constrained input
// (StepInput.Allowed) decodes ahead only with a loop (StepInput.Loop:
// inside a free string), under the same mask, and its tokens are served
// only to steps that pass that mask again. Behind every step (steps of
// more than 32 sequences decode one token each) the worker launches the
// next decode step of its sequences before Step has the tokens, so the
// GPU decodes while the tokens travel and the next step is planned; a
// step that adds prompt chunks or new sequences runs them beside it, one
// that feeds a sequence something else discards it (Tuning.NoOverlap
// turns this off). Steps of prompt chunks replay CUDA graphs captured per
// token bucket on bfloat16 and float16 models, their projections float or
// FP8/int4 (Tuning.NoPrefillGraphs turns this off): one graph of the whole step,
// its attention a Triton kernel reading the cache through the block
// table, or, where that kernel is off (Tuning.NoPromptAttention) or
// disagrees with plain attention at load, graphs piecewise around an
// eager attention.
//
// Models implement engine.Pipeliner when every worker pipelines (both
// backends do): StepAsync sends step N+1 while step N is out, its Prev
// inputs fed on the worker with the token it sampled in N, so the worker
// finds the next step in its pipe when it replies; a step sent behind one
// that failed is not run (engine.ErrNotRun) on the workers where that
// one failed. With several workers a step runs on each worker that has
// the blocks for its part: when one refuses its part for want of blocks
// while others ran theirs, the step returns an *engine.PartialStepError
// naming the inputs that ran. A sequence opened with
// OpenAsync may join the very next step with its first prompt chunk as
// an Opening input, from the prompt's first token: the worker skips the
// tokens the open reused. Batches the lookahead serves (up to 32
// sequences with WithLookahead above 1) stay synchronous.
//
// Several GPUs: WithTensorParallel(n) splits each worker's models over n
// ranks, one process and one GPU each, joined with torch.distributed
// (NCCL; gloo on the CPU): attention and KV heads, the MLP and the
// vocabulary are split Megatron-style, rank 0 speaks the protocol and the
// others follow its requests, and a rank that dies takes its worker down
// (restarted as any lost worker). WithGPUs cuts a device list into
// replicas of n GPUs, one worker each, routed as WithWorkers' workers are
// (data parallel). PROTOCOL.md, "Tensor parallel", has the details.
//
// Models of the torch backend embed (engine.Embedder): OpenPooled opens
// a sequence whose input is pooled (mean, CLS or last token) over the
// last hidden state instead of generating, on every decoder family, in
// chunks and in the same steps as generating sequences; it reuses and
// saves no KV. Encoders (BERT, ModernBERT: Info.Encoder) only embed: Open
// fails with an *engine.InvalidParamError, and each input is fed whole in
// one Step that samples, within the tokens one step carries (a Step
// breaking that rule fails with an *engine.InvalidParamError). Load reads
// the checkpoint's sentence-transformers files (engine.ReadPooling) into
// Info and refuses a pipeline it cannot reproduce; an encoder's
// ContextLength is capped at their max_seq_length.
//
// Models of the torch backend serve LoRA adapters (engine.AdapterModel):
// AddAdapter reads and checks a PEFT or mlx-lm adapter once, in Go
// (internal/lora), and OpenAdapter opens a sequence that runs one; each
// worker keeps ModelSpec.AdapterSlots of them resident (Info.AdapterSlots
// is per worker: loaded by the open that first needs one there, least
// recently opened unused one evicted, a sequence of an adapter preferring
// a worker that holds it), sequences of any adapters and of the base
// share a Step, and KV saved or cached under one adapter is reused by
// that adapter only (saved KV of an adapter removed or replaced is
// dropped and reported by EvictedSaved). WarmAdapter
// (engine.AdapterWarmer) loads an adapter on every worker ahead of its
// requests, and a worker that replaces a lost one gets the pinned
// adapters before it serves.
//
// The worker is configured by the engine's options alone: WithTuning's
// Tuning (KV block size and memory share, the prefix cache, the kernels
// and other switches tests and benchmarks turn) travels on the worker's
// command line with the rest; the worker reads no environment variable.
// The Python runtime is one package (runtime/mlxsworker): a backend
// interface that the torch and mlx_lm backends implement, the protocol
// and sampling parameters once (PROTOCOL.md).
//
// Use:
//
//	eng, err := pyproc.New(ctx, pyproc.WithPython("/usr/bin/python3"), pyproc.WithWorkers(2))
//	defer eng.Close()
//	m, err := eng.Load(ctx, engine.ModelSpec{ID: "llama", Path: dir})
//	reused, err := m.Open(ctx, 1, prompt, "")
//	out, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: prompt, Sample: true, Params: &engine.SamplingParams{}}})
package pyproc

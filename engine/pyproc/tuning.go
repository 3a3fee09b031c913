package pyproc

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"
)

// Tuning holds the worker's settings that a server leaves at their
// defaults and that tests, benchmarks and diagnosis change. Its zero
// value is the default everywhere. The engine sends it to every worker it
// starts, on the worker's command line (PROTOCOL.md, "Start-up"): the
// worker reads no environment variable, so two engines in one program can
// run with different settings and a variable set for some other purpose
// changes nothing.
type Tuning struct {
	// BlockSize is the tokens a block of the paged KV pool holds, 1 to
	// 1024; 0: 16.
	BlockSize int
	// WindowStep is the most tokens one sequence is fed at once within a
	// sliding window's blocks (a longer prompt chunk is fed in pieces of
	// it, giving blocks behind the window back between them), and so how
	// many blocks past the window a sliding group holds; 0: the larger of
	// the block size and 64.
	WindowStep int
	// KVFraction is the share of the device's free memory the KV pool
	// takes at load when the model's KV capacity is not given (CUDA
	// only), above 0 and at most 1; 0: 0.8.
	KVFraction float64
	// NoPrefixCache turns off the worker's automatic prefix cache: a
	// sequence opened without a key starts from no cached blocks.
	NoPrefixCache bool
	// NoSplitSteps runs a step that mixes prompt chunks with decodes as
	// one pass instead of the decodes on their CUDA graph and the chunks
	// in a second pass.
	NoSplitSteps bool
	// NoOverlap stops the worker from launching the next decode step of a
	// step's sequences behind it, before the host has read the step's
	// tokens (CUDA with the kernels; PROTOCOL.md, "Lookahead"). With it
	// the GPU idles while the tokens travel to the engine and the next
	// step comes back.
	NoOverlap bool
	// NoPrefillGraphs runs steps of prompt chunks eagerly instead of on
	// CUDA graphs captured per token count, of the whole step (see
	// NoPromptAttention) or piecewise around attention (CUDA,
	// bfloat16/float16 models, float or FP8/int4 projections, no mixture of experts
	// but on the fused kernels, no tensor parallel; steps with adapters on
	// graphs of their own).
	NoPrefillGraphs bool
	// NoPromptAttention keeps the prompt-step graphs piecewise around
	// each layer's attention (a gather of the chunks' cache and the
	// varlen flash call, run eagerly between the pieces). By default a
	// step of prompt chunks attends through a Triton kernel that reads
	// the cache through the block table, and replays one graph of the
	// whole step, where that kernel agrees with plain attention at load.
	NoPromptAttention bool
	// NoKernels runs the plain torch code instead of the runtime's Triton
	// kernels (CUDA).
	NoKernels bool
	// NoVarlen runs prompt chunks without the variable-length attention
	// kernel (CUDA, bfloat16/float16).
	NoVarlen bool
	// NoAttnPrefetch stops the decode-attention kernel from loading the
	// next tile's block ids one tile ahead.
	NoAttnPrefetch bool
	// DenseLoRA computes every step's adapter deltas over every slot at
	// once, prompt chunks included. By default, on CUDA with the kernels
	// on, segmented Triton kernels compute them (the rows sorted by
	// adapter, each adapter's weights read for its own rows, as Punica's
	// SGMV), checked against the dense delta at the first adapter load;
	// elsewhere the dense delta serves one-token steps and the prompt-step
	// graphs, and eager prompt chunks take a product per adapter.
	DenseLoRA bool
	// NoLoRASideStream runs the segmented kernels' shrink of each
	// projection on the step's own stream. By default it runs on a second
	// CUDA stream of higher priority, beside the base projection's GEMM,
	// which reads the same input (CUDA graphs capture the two as
	// branches): on an H200 that took decode with 8 adapters from 0.77 to
	// 0.81–0.85 of the base's tokens/s. Nothing where the segmented
	// kernels do not run.
	NoLoRASideStream bool
	// NoFP8ScaledMM keeps FP8 projections weight-only at every row count.
	// By default products of 2 rows or more run as W8A8, each token's
	// activations quantized to FP8 by its own scales: products of up to
	// 64 rows (decode batches, short prompt chunks) in one Triton kernel,
	// larger ones through torch._scaled_mm, where the GPU supports it and it agrees
	// with the dequantized product at load.
	NoFP8ScaledMM bool
	// TPTimeout bounds a tensor-parallel collective: a rank silent for
	// longer takes the worker down; 0: 5 minutes.
	TPTimeout time.Duration
	// NoTPGraphs turns CUDA graphs off under tensor parallel only.
	NoTPGraphs bool
	// NoOneShotAllReduce keeps every tensor-parallel all-reduce on NCCL.
	// By default on CUDA those of up to 1 MiB (the row-parallel outputs
	// of decode steps) run as a one-shot all-reduce over peer memory
	// (torch's symmetric memory): each rank reads every peer's partial
	// output once, about half NCCL's latency for these sizes.
	NoOneShotAllReduce bool
	// Profile makes the worker profile itself (cProfile) and log the
	// profile when it exits.
	Profile bool
	// TraceDir makes each worker write a device trace of its steps to
	// this directory (made if missing): torch's profiler records
	// TraceSteps steps after the first TraceSkip, the device's kernels and
	// copies (CUDA) beside the worker's phases (waiting for a request,
	// handling one, waiting for the device), written as
	// trace-<pid>-<n>.json.gz, a Chrome trace that Perfetto opens, with a
	// summary in trace-<pid>-<n>.txt that the worker also logs: the device's
	// busy share of the traced steps, its idle gaps by length, the phase
	// each idle moment fell in, and the largest gaps. A worker that cannot
	// trace (no torch, a directory it cannot write) fails to start. The
	// host's work is slower while it records, and the load stalls as the
	// trace ends, for as long as the profiler takes to stop (seconds; it
	// grows with the host ops recorded): for diagnosis. Engine.Trace takes
	// one on demand instead.
	TraceDir string
	// TraceSkip is the step requests a worker serves before its trace
	// starts (TraceDir), to pass a load's warm-up.
	TraceSkip int
	// TraceSteps is the steps a trace records, at most MaxTraceSteps; 0:
	// 200.
	TraceSteps int
	// StepTokens is the most tokens (decodes plus prompt chunks) one step
	// of a torch-backend decoder carries: the worker sizes its prompt-step
	// graphs for it and reports it as Info.StepTokens, the batcher's
	// default token budget; 0: 4096 on CUDA, elsewhere the batcher's
	// default. The mlx backend and embedding models keep their own. Set it with the batcher's
	// budget (batcher.WithTokenBudget) where that is set: chunks past it
	// run without graphs.
	StepTokens int
}

// check reports the first field out of range.
func (t Tuning) check() error {
	switch {
	case t.BlockSize < 0 || t.BlockSize > 1024:
		return fmt.Errorf("pyproc: Tuning.BlockSize %d: want 0 (16) to 1024", t.BlockSize)
	case t.WindowStep < 0:
		return fmt.Errorf("pyproc: Tuning.WindowStep %d: want 0 or more", t.WindowStep)
	case !(t.KVFraction >= 0 && t.KVFraction <= 1): // also refuses NaN
		return fmt.Errorf("pyproc: Tuning.KVFraction %v: want 0 (0.8) to 1", t.KVFraction)
	case t.StepTokens < 0:
		return fmt.Errorf("pyproc: Tuning.StepTokens %d: want 0 or more", t.StepTokens)
	case t.TraceSkip < 0:
		return fmt.Errorf("pyproc: Tuning.TraceSkip %d: want 0 or more", t.TraceSkip)
	case t.TraceSteps < 0 || t.TraceSteps > MaxTraceSteps:
		return fmt.Errorf("pyproc: Tuning.TraceSteps %d: want 0 (%d) to %d", t.TraceSteps, DefaultTraceSteps, MaxTraceSteps)
	case t.TPTimeout < 0:
		return fmt.Errorf("pyproc: Tuning.TPTimeout %v: want 0 (5m) or more", t.TPTimeout)
	}
	return nil
}

// WithTuning sets the workers' tuning (see Tuning). A field out of range
// fails New.
func WithTuning(t Tuning) Option {
	return func(c *config) error {
		if err := t.check(); err != nil {
			return err
		}
		if t.TraceDir != "" {
			// The workers' working directory need not be this process's.
			dir, err := filepath.Abs(t.TraceDir)
			if err != nil {
				return fmt.Errorf("pyproc: Tuning.TraceDir %q: %w", t.TraceDir, err)
			}
			t.TraceDir = dir
		}
		c.tuning = t
		return nil
	}
}

// settings is what the worker receives as --settings: every key, the
// defaults resolved, in the worker's names (PROTOCOL.md).
type settings struct {
	BlockSize     int     `json:"block_size"`
	WindowStep    int     `json:"window_step"`
	KVFraction    float64 `json:"kv_fraction"`
	PrefixCache   bool    `json:"prefix_cache"`
	SplitSteps    bool    `json:"split_steps"`
	Overlap       bool    `json:"overlap"`
	PrefillGraphs bool    `json:"prefill_graphs"`
	PromptAttn    bool    `json:"prompt_attention"`
	Kernels       bool    `json:"kernels"`
	Varlen        bool    `json:"varlen"`
	AttnPrefetch  bool    `json:"attn_prefetch"`
	LoRAPlan      string  `json:"lora_plan"`
	LoRASide      bool    `json:"lora_side_stream"`
	FP8ScaledMM   bool    `json:"fp8_scaled_mm"`
	TPTimeout     float64 `json:"tp_timeout"`
	TPGraphs      bool    `json:"tp_graphs"`
	TPOneShot     bool    `json:"tp_oneshot"`
	Profile       bool    `json:"profile"`
	TraceDir      string  `json:"trace_dir"`
	TraceSkip     int     `json:"trace_skip"`
	TraceSteps    int     `json:"trace_steps"`
	MaxLookahead  int     `json:"max_lookahead"` // WithLookahead's bound, which the worker clips at too
	StepTokens    int     `json:"step_tokens"`
}

// settingsArg returns the --settings argument for t.
func (t Tuning) settingsArg() string {
	s := settings{BlockSize: t.BlockSize, WindowStep: t.WindowStep, KVFraction: t.KVFraction,
		PrefixCache: !t.NoPrefixCache, SplitSteps: !t.NoSplitSteps, Overlap: !t.NoOverlap, PrefillGraphs: !t.NoPrefillGraphs, PromptAttn: !t.NoPromptAttention, Kernels: !t.NoKernels,
		Varlen: !t.NoVarlen, AttnPrefetch: !t.NoAttnPrefetch, LoRAPlan: "auto", LoRASide: !t.NoLoRASideStream,
		FP8ScaledMM: !t.NoFP8ScaledMM, TPTimeout: t.TPTimeout.Seconds(), TPGraphs: !t.NoTPGraphs,
		TPOneShot: !t.NoOneShotAllReduce,
		Profile:   t.Profile, TraceDir: t.TraceDir, TraceSkip: t.TraceSkip, TraceSteps: t.TraceSteps,
		MaxLookahead: maxLookahead, StepTokens: t.StepTokens}
	if s.BlockSize == 0 {
		s.BlockSize = 16
	}
	if s.KVFraction == 0 {
		s.KVFraction = 0.8
	}
	if s.TPTimeout == 0 {
		s.TPTimeout = 300
	}
	if s.TraceSteps == 0 {
		s.TraceSteps = DefaultTraceSteps
	}
	if t.DenseLoRA {
		s.LoRAPlan = "dense"
	}
	b, err := json.Marshal(s)
	if err != nil { // plain fields: cannot fail
		panic(err)
	}
	return string(b)
}

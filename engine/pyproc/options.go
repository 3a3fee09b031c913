package pyproc

import (
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// Option configures New. Options validate their values; New returns the
// first error.
type Option func(*config) error

type config struct {
	python       string
	workers      int
	workersSet   bool // WithWorkers was given: WithGPUs must agree with it
	tp           int  // tensor-parallel ranks per worker (0 or 1: none)
	gpus         []int
	backend      string
	device       string
	dtype        string
	startTimeout time.Duration
	hbInterval   time.Duration
	hbTimeout    time.Duration
	logger       *slog.Logger
	cacheDir     string
	maxLine      int
	threads      int
	noGraphs     bool
	lookahead    int
	quantize     string
	kvCacheDtype string
	tuning       Tuning
	faults       bool // test hook: lets the worker obey "fault" requests
	restart      *retry.Policy
	breakerOpts  []retry.BreakerOption
}

// defaultRestart waits 50 ms, growing ×1.5 to 10 s, between attempts to
// replace a lost worker, and never gives up while the engine is open.
func defaultRestart() *retry.Policy {
	return retry.MustPolicy(retry.WithBackoff(50*time.Millisecond, 10*time.Second, 1.5),
		retry.WithJitter(0.2), retry.WithMaxAttempts(0), retry.WithClassifier(func(error) bool { return true }))
}

func defaults() config {
	return config{
		python:       "python3",
		workers:      1,
		backend:      "auto",
		device:       "auto",
		dtype:        "auto",
		kvCacheDtype: "auto",
		startTimeout: 60 * time.Second,
		hbInterval:   500 * time.Millisecond,
		hbTimeout:    5 * time.Second,
		logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		maxLine:      64 << 20,
		restart:      defaultRestart(),
	}
}

// WithRestartPolicy sets how a lost worker is replaced: the wait before
// each start attempt, and when to stop trying (its attempts and elapsed
// time; a slot that gives up stays empty and its sequences go to the other
// workers). The default waits 50 ms growing ×1.5 to 10 s, with 20% jitter,
// and never gives up. The policy's count starts again after a worker has
// run for a minute.
func WithRestartPolicy(p *retry.Policy) Option {
	return func(c *config) error {
		if p == nil {
			return fmt.Errorf("pyproc: WithRestartPolicy: nil policy")
		}
		c.restart = p
		return nil
	}
}

// WithBreaker configures the circuit breaker each worker has. A sequence
// is one request of its worker's breaker: it succeeds when it is freed
// normally and fails when the worker is lost under it. New sequences are
// routed away from a worker whose breaker is open (or half-open with its
// probes taken); when every worker's breaker refuses, the least-loaded
// live worker takes the sequence anyway, so a pool never refuses work it
// could run. Without this option the breakers use retry's defaults.
func WithBreaker(opts ...retry.BreakerOption) Option {
	return func(c *config) error {
		if _, err := retry.NewBreaker("check", opts...); err != nil {
			return fmt.Errorf("pyproc: WithBreaker: %w", err)
		}
		c.breakerOpts = append(c.breakerOpts, opts...)
		return nil
	}
}

// WithPython sets the Python interpreter, a path or a name looked up on
// PATH. The default is "python3".
func WithPython(path string) Option {
	return func(c *config) error {
		if path == "" {
			return fmt.Errorf("pyproc: WithPython: empty path")
		}
		c.python = path
		return nil
	}
}

// WithWorkers sets the number of worker processes, each holding its own
// copy of every loaded model. The default is 1.
func WithWorkers(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("pyproc: WithWorkers(%d): want at least 1", n)
		}
		c.workers, c.workersSet = n, true
		return nil
	}
}

// WithBackend picks the runtime's backend: "auto" (the default: mlx where
// mlx_lm imports, torch otherwise), "torch" or "mlx".
func WithBackend(name string) Option {
	return func(c *config) error {
		switch name {
		case "auto", "torch", "mlx":
			c.backend = name
			return nil
		}
		return fmt.Errorf("pyproc: WithBackend(%q): want auto, torch or mlx", name)
	}
}

// WithDevice picks the torch device: "auto" (the default: CUDA when torch
// sees one), "cpu" or "cuda".
func WithDevice(name string) Option {
	return func(c *config) error {
		switch name {
		case "auto", "cpu", "cuda":
			c.device = name
			return nil
		}
		return fmt.Errorf("pyproc: WithDevice(%q): want auto, cpu or cuda", name)
	}
}

// WithDType picks the compute dtype: "auto" (the default: bfloat16 on
// CUDA, float32 on CPU), "float32", "bfloat16" or "float16".
func WithDType(name string) Option {
	return func(c *config) error {
		switch name {
		case "auto", "float32", "bfloat16", "float16":
			c.dtype = name
			return nil
		}
		return fmt.Errorf("pyproc: WithDType(%q): want auto, float32, bfloat16 or float16", name)
	}
}

// WithStartTimeout bounds a worker's start-up, from launch to its
// handshake. The default is 60s (importing torch can be slow).
func WithStartTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("pyproc: WithStartTimeout(%v): want a positive duration", d)
		}
		c.startTimeout = d
		return nil
	}
}

// WithHeartbeat sets how often workers send heartbeats and how long a
// silent worker is given before it is killed and replaced. The defaults
// are 500ms and 5s. A silent worker that the kernel shows busy (its
// heartbeat starved, not hung) gets up to four timeouts (Linux).
func WithHeartbeat(interval, timeout time.Duration) Option {
	return func(c *config) error {
		if interval <= 0 || timeout <= interval {
			return fmt.Errorf("pyproc: WithHeartbeat(%v, %v): want 0 < interval < timeout", interval, timeout)
		}
		c.hbInterval, c.hbTimeout = interval, timeout
		return nil
	}
}

// WithLogger receives supervision events and the workers' stderr. The
// default discards them.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("pyproc: WithLogger: nil logger")
		}
		c.logger = l
		return nil
	}
}

// WithCacheDir sets where the embedded runtime is written (in a
// subdirectory named by its content hash, created 0700). The default is the
// user cache directory's "mlxserving". The directory must not be writable
// by other users (unless sticky, like /tmp); the runtime's own directory
// must be ours, 0700, and hold exactly the embedded files, checked before
// every worker start (else ErrUnsafeRuntime).
func WithCacheDir(dir string) Option {
	return func(c *config) error {
		if dir == "" {
			return fmt.Errorf("pyproc: WithCacheDir: empty path")
		}
		c.cacheDir = dir
		return nil
	}
}

// WithMaxLineBytes sets the protocol's line limit in both directions. The
// default is 64 MiB.
func WithMaxLineBytes(n int) Option {
	return func(c *config) error {
		if n < 4096 {
			return fmt.Errorf("pyproc: WithMaxLineBytes(%d): want at least 4096", n)
		}
		c.maxLine = n
		return nil
	}
}

// WithThreads sets each worker's CPU thread count for torch. Zero (the
// default) leaves torch's own choice (a thread a core) on the CPU; a
// worker whose model runs on a GPU then computes torch's CPU ops on one
// thread (loads still use every core), as a thread a core made its few
// small CPU ops many times slower on a many-core host.
func WithThreads(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("pyproc: WithThreads(%d): want 0 or more", n)
		}
		c.threads = n
		return nil
	}
}

// WithCUDAGraphs turns CUDA graphs for decode steps on (the default) or
// off. They only apply on CUDA devices.
func WithCUDAGraphs(on bool) Option {
	return func(c *config) error {
		c.noGraphs = !on
		return nil
	}
}

// WithQuantize quantizes float checkpoints at load: "fp8" stores the
// decoder's projections (q, k, v, o, gate, up, down) as float8 e4m3 with
// one scale per output channel (max|row| / 448), as vLLM's
// --quantization fp8; "" (the default) loads weights as they are. On
// CUDA (torch backend) the projections then run as FP8, halving their
// memory; on CPU they are rounded to the FP8 grid and kept in float, so
// the CPU serves the numbers the GPU does. A checkpoint that is already
// quantized is refused with it. See PROTOCOL.md's load.
func WithQuantize(method string) Option {
	return func(c *config) error {
		switch method {
		case "", "fp8":
			c.quantize = method
			return nil
		}
		return fmt.Errorf("pyproc: WithQuantize(%q): want \"\" or fp8", method)
	}
}

// WithKVCacheDtype sets how the paged KV pool stores keys and values
// (torch backend): "auto" (the default) in the model's dtype, "fp8" as
// float8 e4m3 with one scale per layer for keys and one for values (1.0,
// or the checkpoint's self_attn.k_scale and v_scale where it carries
// them), as vLLM's --kv-cache-dtype fp8. FP8 takes one byte an element,
// so a pool sized from memory holds twice the tokens of bfloat16 (four
// times float32's) at some precision in attention; on CUDA the decode
// kernel reads the bytes and converts them in registers. Another value
// fails New with an error wrapping engine.ErrInvalidParam. See
// PROTOCOL.md's load.
func WithKVCacheDtype(name string) Option {
	return func(c *config) error {
		switch name {
		case "auto", "fp8":
			c.kvCacheDtype = name
			return nil
		}
		return fmt.Errorf("pyproc: WithKVCacheDtype(%q): want auto or fp8: %w", name, engine.ErrInvalidParam)
	}
}

// WithLookahead sets how many tokens a decode step asks the worker for
// per sequence: the worker keeps decoding, feeding each sequence its own
// sampled token, and later Steps take the tokens from the buffer without a
// round trip (see PROTOCOL.md, "Lookahead"). A sequence that stops early
// wastes at most n-1 decoded tokens; one fed other tokens than it was
// given is rolled back. 1 turns it off; 0 (the default) picks 8 on CUDA
// and 1 elsewhere. At most 64. Steps of more than 32 sequences decode
// one token at a time whatever n is: large batches keep the device busy
// without it, and prompts waiting for the next step do not wait behind a
// chain of decode steps.
func WithLookahead(n int) Option {
	return func(c *config) error {
		if n < 0 || n > maxLookahead {
			return fmt.Errorf("pyproc: WithLookahead(%d): want 0 (auto) to %d", n, maxLookahead)
		}
		c.lookahead = n
		return nil
	}
}

// withFaults lets tests make workers misbehave on request (the protocol's
// "fault" op, refused otherwise).
func withFaults() Option {
	return func(c *config) error {
		c.faults = true
		return nil
	}
}

// WithTensorParallel splits every model of a worker over n ranks, one
// process and one device each (torch backend): rank i of a worker uses
// its i-th CUDA device (of those WithGPUs gives it), or the CPU with
// gloo. Attention and KV heads, the MLP and the vocabulary are split
// (PROTOCOL.md, "Tensor parallel"); a model whose heads, KV heads or
// intermediate size n does not divide, a mixture of experts, fused
// projections (Phi-3), OLMo 2's whole-width QK norm and quantized weights
// are refused at load (engine.ErrInvalidParam). The default, 1, runs each
// worker as one process.
func WithTensorParallel(n int) Option {
	return func(c *config) error {
		if n < 1 || n > 64 {
			return fmt.Errorf("pyproc: WithTensorParallel(%d): want 1 to 64", n)
		}
		c.tp = n
		return nil
	}
}

// WithGPUs gives the engine these CUDA devices (ids as nvidia-smi numbers
// them): they are cut into replicas of WithTensorParallel's size, in
// order, and each replica is one worker (data parallel, routed as
// WithWorkers' workers are) that sees only its devices
// (CUDA_VISIBLE_DEVICES). "-gpus 0,1,2,3 -tp 2" serves two replicas, on
// GPUs 0,1 and 2,3. The count must be a multiple of the tensor-parallel
// size, and WithWorkers, when given too, must equal the replicas. Without
// it every worker sees every device the process does.
func WithGPUs(ids []int) Option {
	return func(c *config) error {
		if len(ids) == 0 {
			return fmt.Errorf("pyproc: WithGPUs: no devices")
		}
		seen := map[int]bool{}
		for _, id := range ids {
			if id < 0 || seen[id] {
				return fmt.Errorf("pyproc: WithGPUs(%v): want distinct device ids of 0 or more", ids)
			}
			seen[id] = true
		}
		c.gpus = append([]int(nil), ids...)
		return nil
	}
}

// placeGPUs checks the options that only the torch backend serves and
// sets the workers from the GPUs given: one per replica of
// tensorParallel() devices.
func (c *config) placeGPUs() error {
	if c.backend == "mlx" {
		switch {
		case c.tp > 1:
			return fmt.Errorf("pyproc: WithTensorParallel(%d): the mlx backend runs a model in one process; tensor parallel needs the torch backend", c.tp)
		case c.quantize != "":
			return fmt.Errorf("pyproc: WithQuantize(%q): the mlx backend serves MLX's own quantized checkpoints; -quantize needs the torch backend", c.quantize)
		case c.kvCacheDtype != "auto":
			return fmt.Errorf("pyproc: WithKVCacheDtype(%q): the mlx backend keeps its KV cache in the model's dtype; it needs the torch backend", c.kvCacheDtype)
		case len(c.gpus) > 0:
			return fmt.Errorf("pyproc: WithGPUs(%v): the mlx backend does not place CUDA devices; it needs the torch backend", c.gpus)
		}
	}
	if len(c.gpus) == 0 {
		return nil
	}
	n := c.tensorParallel()
	if len(c.gpus)%n != 0 {
		return fmt.Errorf("pyproc: WithGPUs(%v): %d devices do not make whole replicas of tensor parallel %d", c.gpus, len(c.gpus), n)
	}
	if c.workersSet && c.workers != len(c.gpus)/n {
		return fmt.Errorf("pyproc: WithWorkers(%d) with WithGPUs(%v) and tensor parallel %d: the devices make %d replicas",
			c.workers, c.gpus, n, len(c.gpus)/n)
	}
	c.workers = len(c.gpus) / n
	return nil
}

// tensorParallel is the ranks of one worker (at least 1).
func (c *config) tensorParallel() int { return max(1, c.tp) }

// visibleDevices is the CUDA_VISIBLE_DEVICES of worker slot i ("" when
// WithGPUs was not given: the process's own).
func (c *config) visibleDevices(slot int) string {
	if len(c.gpus) == 0 {
		return ""
	}
	n := c.tensorParallel()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = strconv.Itoa(c.gpus[slot*n+i])
	}
	return strings.Join(ids, ",")
}

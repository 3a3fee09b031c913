// Command server is an OpenAI-compatible HTTP server over mlxserving: the
// template for serving models from a Go program.
//
//	go run ./examples/server                       # the project's generated test model
//	go run ./examples/server -model /models/Llama-3.2-1B-Instruct -engine pyproc
//	go run ./examples/server -model /models/llama -prewarm qwen=/models/qwen:5,phi=/models/phi -memory-budget 24GiB
//	curl -N 127.0.0.1:8080/v1/chat/completions -d '{"model":"tiny","stream":true,
//	     "messages":[{"role":"user","content":"Hello"}],"max_tokens":32}'
//
// Without -model it writes the project's small random-weight checkpoint
// (testmodel) to a temporary directory and serves it as "tiny". The
// engine is chosen by -engine: "auto" (the default) takes the Python engine
// when python3 with torch can run, then the MLX engine when built with the
// mlx tag, and otherwise the simulated engine (pseudo-tokens, no model),
// which it says in the log. Metrics are served in Prometheus format on
// /metrics from the server's own registry. -api-keys FILE (see
// openai.LoadKeyFile) and $MLXSERVING_API_KEYS (name:key,...) require API
// keys; without them the server takes anyone's requests, and warns when it
// listens beyond loopback. scripts/serve.sh runs it on the Python engine,
// installing Debian's python3-torch first if needed. SIGTERM or SIGINT stop it
// gracefully: it stops accepting, lets in-flight streams finish (up to
// -drain), then unloads the models.
//
// The -model checkpoint is pre-warmed (loaded, its engine warm-up run at
// every batch-size bucket, one short generation) before /ready turns 200
// and it stays loaded. -prewarm names more checkpoints (id=dir[:priority],
// comma-separated) that are pre-warmed after it, highest priority first,
// while the server already serves; they load again on demand after being
// unloaded when idle (keep-alive, five minutes by default) or to stay under
// -memory-budget (bytes, or with a kB/MB/GB/KiB/MiB/GiB suffix), which
// evicts the least recently used idle model.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/merge"
	"github.com/mlxserving/mlxserving/openai"
	"github.com/mlxserving/mlxserving/openai/vllm"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/retry"
)

func main() {
	// The MLX engine serves float32 checkpoints in float32: MLX would run
	// their matrix products in TF32 on a GPU that has it unless told so
	// (the environment wins when it sets the variable).
	if _, set := os.LookupEnv("MLX_ENABLE_TF32"); !set {
		_ = os.Setenv("MLX_ENABLE_TF32", "0")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
}

type options struct {
	addr, model, modelID, engine, python string
	apiKeys                              string
	drain, simStep                       time.Duration
	verbose                              bool
	// Request merging and deadlines.
	merge        bool
	cacheBytes   int64
	cacheTTL     time.Duration
	deadlines    retry.Deadlines
	prewarm      []prewarm.Model
	memoryBudget int64
	cluster      clusterFlags
	// Batching: 0 keeps the defaults (the engine's max batch; its step size, else batcher.DefaultTokenBudget).
	maxBatch, tokenBudget int
	lookahead             int     // pyproc: tokens a decode step asks for (0: the engine's default)
	quantize              string  // pyproc: quantize float checkpoints at load ("fp8"; "": as they are)
	kvCacheDtype          string  // pyproc: how the KV pool stores keys and values ("auto": the model's dtype, or "fp8")
	noJumpForward         bool    // constrained output sampled one token a step (batcher.WithJumpForward)
	textSerial            bool    // each token's text work before the next step (batcher.WithTextBehindStep(false))
	noPipeline            bool    // every step waits for the one before it (batcher.WithPipeline(false))
	tp                    int     // pyproc: tensor-parallel ranks per worker (1: none)
	gpus                  []int   // pyproc: CUDA devices, cut into replicas of tp (nil: every worker sees all)
	kvFraction            float64 // pyproc: share of free GPU memory the KV pool takes (0: 0.8)
	blockSize             int     // pyproc: tokens a KV block holds (0: 16)
	loraDense             bool    // pyproc: adapter deltas over every slot at once, not the segmented kernels (Tuning.DenseLoRA)
	loraNoSideStream      bool    // pyproc: the segmented kernels' shrink on the step's stream (Tuning.NoLoRASideStream)
	traceDir              string  // pyproc: where each worker writes a device trace of its steps (Tuning.TraceDir; "": none)
	traceSkip, traceSteps int     // pyproc: the steps served before the trace starts, and the steps it records
	// LoRA adapters served over the main model (-lora name=dir, repeated),
	// and the main model's adapter slots and highest rank (0: the engine's).
	adapters                  []mlxserving.AdapterSpec
	adapterSlots, adapterRank int
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "address to listen on")
	fs.StringVar(&o.model, "model", "", "Hugging Face-layout checkpoint directory (default: the generated test model)")
	fs.StringVar(&o.modelID, "model-id", "", "the model's id in requests (default: the directory's name, or \"tiny\")")
	fs.StringVar(&o.engine, "engine", "auto", "auto, pyproc, mlx or sim")
	fs.StringVar(&o.python, "python", "", "python interpreter for the pyproc engine (default: python3 on PATH)")
	fs.DurationVar(&o.drain, "drain", 30*time.Second, "how long shutdown waits for in-flight requests")
	fs.DurationVar(&o.simStep, "sim-step", time.Millisecond, "the simulated engine's fixed time per step")
	fs.BoolVar(&o.verbose, "v", false, "debug logging")
	fs.IntVar(&o.maxBatch, "max-batch", 0, "most sequences in one engine step (default: what the engine reports)")
	fs.IntVar(&o.tokenBudget, "token-budget", 0, fmt.Sprintf("most tokens (decodes plus prompt chunks) in one engine step (default: what the engine reports, else %d); the python engine sizes its prompt-step graphs to it", batcher.DefaultTokenBudget))
	fs.IntVar(&o.lookahead, "lookahead", 0, "python engine: tokens each decode step asks the worker for (1: off; default 8 on CUDA, 1 elsewhere)")
	fs.StringVar(&o.quantize, "quantize", "", "python engine: fp8 quantizes a float checkpoint's projections at load, per output channel (served as FP8 on CUDA)")
	fs.StringVar(&o.kvCacheDtype, "kv-cache-dtype", "auto", "python engine: auto keeps the KV cache in the model's dtype; fp8 stores it as float8 e4m3 (one byte an element: twice bfloat16's tokens in the same memory)")
	fs.BoolVar(&o.noPipeline, "no-pipeline", false, "send each engine step only after the previous step's tokens are back (default: the next step is sent while the engine runs one, on engines that take steps ahead)")
	fs.BoolVar(&o.textSerial, "text-serial", false, "detokenize each token and hand its chunk over before the next step is built (default: behind the next step, while the engine runs it)")
	fs.BoolVar(&o.noJumpForward, "no-jump-forward", false, "sample every token of structured output, even where the schema allows only one continuation (default: forced runs are appended without a forward pass each)")
	fs.StringVar(&o.apiKeys, "api-keys", "", "JSON file of API keys (see openai.LoadKeyFile; also $"+keysEnv+"=name:key,...); default: no keys")
	fs.BoolVar(&o.merge, "merge", false, "identical deterministic requests in flight share one generation")
	fs.Int64Var(&o.cacheBytes, "cache-bytes", 0, "with -merge: response cache size in bytes for requests with \"cache\": true (0: no cache)")
	fs.DurationVar(&o.cacheTTL, "cache-ttl", 10*time.Minute, "with -cache-bytes: how long a cached response is served")
	fs.DurationVar(&o.deadlines.FirstToken, "ttft-deadline", 0, "end requests whose first token takes longer (0: none)")
	fs.DurationVar(&o.deadlines.Stall, "stall-deadline", 0, "end requests that produce no token for this long (0: none)")
	fs.DurationVar(&o.deadlines.Total, "total-deadline", 0, "end requests that run longer (0: none)")
	lora := func(pinned bool) func(string) error {
		return func(v string) error {
			name, dir, ok := strings.Cut(v, "=")
			if !ok || name == "" || dir == "" {
				return fmt.Errorf("want name=dir, got %q", v)
			}
			o.adapters = append(o.adapters, mlxserving.AdapterSpec{Name: name, Path: dir, Pinned: pinned})
			return nil
		}
	}
	fs.Func("lora", "serve a LoRA adapter (PEFT or mlx-lm directory) over the model as its own model id: name=dir (repeat for more)", lora(false))
	fs.Func("lora-pinned", "as -lora, and the adapter keeps its device slot once resident (never evicted for another adapter)", lora(true))
	fs.IntVar(&o.adapterSlots, "lora-slots", 0, fmt.Sprintf("LoRA adapters kept on the device at once, least recently used evicted (default %d)", engine.DefaultAdapterSlots))
	fs.IntVar(&o.adapterRank, "max-lora-rank", 0, fmt.Sprintf("highest LoRA rank accepted (default %d)", engine.DefaultMaxAdapterRank))
	prewarmList := fs.String("prewarm", "", "more models to pre-warm: id=dir[:priority],... (loaded on demand after an unload)")
	budget := fs.String("memory-budget", "", "memory budget of the loaded models (e.g. 16GiB; default none)")
	fs.IntVar(&o.tp, "tp", 1, "python engine: tensor parallel, the GPUs (ranks) each model copy is split over")
	fs.Float64Var(&o.kvFraction, "kv-fraction", 0, "python engine: share of the GPU's free memory the KV pool takes at load (default 0.8)")
	fs.IntVar(&o.blockSize, "block-size", 0, "python engine: tokens a block of the paged KV pool holds (default 16)")
	fs.BoolVar(&o.loraDense, "lora-dense", false, "python engine: LoRA deltas over every adapter slot at once, not the segmented Triton kernels that CUDA runs by default (pyproc.Tuning.DenseLoRA)")
	fs.BoolVar(&o.loraNoSideStream, "lora-no-side-stream", false, "python engine: each projection's LoRA shrink on the step's own CUDA stream, not on a second one beside the base projection (pyproc.Tuning.NoLoRASideStream)")
	fs.StringVar(&o.traceDir, "trace-dir", "", "python engine: where device traces go, trace-PID-N.json.gz (Perfetto opens it) beside a summary, trace-PID-N.txt, of where the GPU idled; serves POST /debug/trace?steps=N&timeout=D (admin key), which traces every worker's next N steps and answers with the summaries (pyproc.Engine.Trace; slows the traced steps; for diagnosis)")
	fs.IntVar(&o.traceSkip, "trace-skip", 0, "python engine, with -trace-dir and -trace-steps: steps each worker serves before its start-up trace")
	fs.IntVar(&o.traceSteps, "trace-steps", 0, "python engine, with -trace-dir: each worker traces this many steps from start-up, past -trace-skip (pyproc.Tuning.TraceDir; 0: none but on request)")
	gpus := fs.String("gpus", "", "python engine: CUDA device ids, e.g. 0,1,2,3; with -tp 2 two replicas (0,1 and 2,3) serve behind one engine (default: one worker on the devices the process sees)")
	o.cluster.register(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	if o.prewarm, err = parsePrewarm(*prewarmList); err != nil {
		return o, err
	}
	if o.memoryBudget, err = parseBytes(*budget); err != nil {
		return o, fmt.Errorf("-memory-budget: %w", err)
	}
	if o.gpus, err = parseGPUs(*gpus); err != nil {
		return o, err
	}
	if o.tp < 1 {
		return o, fmt.Errorf("-tp %d: want 1 or more", o.tp)
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch o.engine {
	case "auto", "pyproc", "mlx", "sim":
	default:
		return o, fmt.Errorf("-engine %q: want auto, pyproc, mlx or sim", o.engine)
	}
	if err := checkKVCacheDtype(o); err != nil {
		return o, err
	}
	if o.cacheBytes < 0 || o.cacheTTL <= 0 || (o.cacheBytes > 0 && !o.merge) {
		return o, fmt.Errorf("-cache-bytes %d, -cache-ttl %v: want a size of 0 or more, a positive TTL, and -merge", o.cacheBytes, o.cacheTTL)
	}
	if err := o.deadlines.Validate(); err != nil {
		return o, err
	}
	if o.adapterSlots < 0 || o.adapterRank < 0 {
		return o, fmt.Errorf("-lora-slots %d, -max-lora-rank %d: want 0 (the engine's default) or more", o.adapterSlots, o.adapterRank)
	}
	if o.traceSteps < 0 || o.traceSkip < 0 || (o.traceSteps > 0 || o.traceSkip > 0) && o.traceDir == "" || o.traceSkip > 0 && o.traceSteps == 0 {
		return o, fmt.Errorf("-trace-steps %d, -trace-skip %d: want 0 or more, with -trace-dir, and -trace-skip only with -trace-steps", o.traceSteps, o.traceSkip)
	}
	if err := o.cluster.check(); err != nil {
		return o, err
	}
	return o, nil
}

// checkKVCacheDtype refuses a -kv-cache-dtype other than auto or fp8, and
// fp8 with an engine that keeps its KV cache in the model's dtype.
func checkKVCacheDtype(o options) error {
	switch {
	case o.kvCacheDtype != "auto" && o.kvCacheDtype != "fp8":
		return fmt.Errorf("-kv-cache-dtype %q: want auto or fp8", o.kvCacheDtype)
	case o.kvCacheDtype == "fp8" && (o.engine == "mlx" || o.engine == "sim"):
		return fmt.Errorf("-kv-cache-dtype fp8: the %s engine keeps its KV cache in the model's dtype; fp8 needs -engine pyproc (or auto)", o.engine)
	}
	return nil
}

// run serves until ctx ends, then shuts down gracefully. If listening is
// not nil it receives the address once the server accepts connections.
func run(ctx context.Context, args []string, logOut io.Writer, listening chan<- string) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if o.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: level}))

	dir, id, cleanup, err := checkpoint(o)
	if err != nil {
		return err
	}
	if o.model == "" {
		log.Warn("serving the project's GENERATED test model: real architecture and tokenizer, RANDOM weights, so its text is gibberish; pass -model DIR to serve a real checkpoint",
			"model", id, "path", dir)
	}
	defer cleanup()
	mp, metricsHandler, reg, err := newMetrics()
	if err != nil {
		return err
	}
	defer func() { _ = mp.Shutdown(context.WithoutCancel(ctx)) }()
	rs, err := openReplicas(ctx, o, dir, log, mp)
	if err != nil {
		return err
	}
	defer rs.close()
	if err := registerVLLM(reg, rs); err != nil {
		return err
	}

	keyOpts, nkeys, err := apiKeys(o.apiKeys, os.Getenv)
	if err != nil {
		return err
	}
	pws, err := newPrewarmers(rs, o, dir, id, log)
	if err != nil {
		return err
	}
	defer pws.stop()
	hopts := append([]openai.Option{openai.WithLogger(log), openai.WithMeterProvider(mp),
		openai.WithMetricsHandler(metricsHandler), openai.WithReadyCheck(pws.checkReady)}, keyOpts...)
	if o.traceDir != "" {
		engines, err := pythonEngines(rs.engines)
		if err != nil {
			return err
		}
		hopts = append(hopts, openai.WithTraceHandler(traceHandler(engines, o.traceDir)))
	}
	h, err := openai.New(rs.front(), hopts...)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	log.Info("listening", "addr", ln.Addr().String())
	warnIfExposed(ln.Addr(), nkeys, log)

	if err := pws.start(ctx, log); err != nil {
		_ = hs.Close()
		<-served
		return err
	}
	for _, info := range rs.servers[0].Models() {
		if info.ID == id {
			log.Info("serving", "engine", info.Engine, "model", id, "path", dir, "context", info.ContextLength, "replicas", len(rs.servers))
		}
	}
	// Advertised to the cluster once the main model and its adapters serve.
	err = serveAdapters(ctx, rs, id, o.adapters, log)
	rs.refresh()
	var leave func(context.Context)
	if err == nil {
		leave, err = joinCluster(o.cluster, rs.front(), log)
	}
	if err != nil {
		_ = hs.Close()
		<-served
		return err
	}
	if listening != nil {
		listening <- ln.Addr().String()
	}
	select {
	case <-ctx.Done():
	case err := <-served:
		leave(context.Background())
		return err
	}
	// Leave the cluster first: balancers stop routing here, the streams
	// they sent finish; then the HTTP side.
	leaveCtx, cancel := context.WithTimeout(context.Background(), o.drain)
	leave(leaveCtx)
	cancel()
	return shutdown(hs, rs, served, o.drain, log)
}

// serverOptions are the Server's options from the flags.
func serverOptions(o options, log *slog.Logger, mp *sdkmetric.MeterProvider) []mlxserving.Option {
	opts := []mlxserving.Option{mlxserving.WithLogger(log), mlxserving.WithMeterProvider(mp), mlxserving.WithDeadlines(o.deadlines),
		mlxserving.WithMemoryBudget(o.memoryBudget)}
	if o.maxBatch > 0 {
		opts = append(opts, mlxserving.WithBatcherOptions(batcher.WithMaxBatch(o.maxBatch)))
	}
	if o.tokenBudget > 0 {
		opts = append(opts, mlxserving.WithBatcherOptions(batcher.WithTokenBudget(o.tokenBudget)))
	}
	if o.noJumpForward {
		opts = append(opts, mlxserving.WithBatcherOptions(batcher.WithJumpForward(false)))
	}
	if o.textSerial {
		opts = append(opts, mlxserving.WithBatcherOptions(batcher.WithTextBehindStep(false)))
	}
	if o.noPipeline {
		opts = append(opts, mlxserving.WithBatcherOptions(batcher.WithPipeline(false)))
	}
	if o.merge {
		var mopts []merge.Option
		if o.cacheBytes > 0 {
			mopts = append(mopts, merge.WithCache(o.cacheBytes, o.cacheTTL))
		}
		opts = append(opts, mlxserving.WithMerging(mopts...))
	}
	return opts
}

// registerVLLM registers the Servers' prefix-cache counters and their
// queue, running and KV gauges under vLLM's names, for routers built for
// vLLM (replicas summed: they serve the model together).
func registerVLLM(reg prometheus.Registerer, rs *replicas) error {
	if err := reg.Register(vllm.PrefixCacheCollector(rs.servers...)); err != nil {
		return err
	}
	gauges, err := vllm.LoadCollector(rs.front())
	if err != nil {
		return err
	}
	return reg.Register(gauges)
}

// serveAdapters loads the -lora adapters over the main model id, on every
// replica.
func serveAdapters(ctx context.Context, rs *replicas, id string, adapters []mlxserving.AdapterSpec, log *slog.Logger) error {
	for _, a := range adapters {
		a.Base = id
		st, err := rs.loadAdapter(ctx, a)
		if err != nil {
			return fmt.Errorf("-lora %s=%s: %w", a.Name, a.Path, err)
		}
		log.Info("serving adapter", "adapter", st.Name, "base", id, "path", st.Path, "rank", st.Rank, "targets", st.Targets)
	}
	return nil
}

// shutdown stops accepting, waits for in-flight requests (streams
// included), then drains and unloads the models.
func shutdown(hs *http.Server, rs *replicas, served <-chan error, drain time.Duration, log *slog.Logger) error {
	log.Info("shutting down", "drain", drain)
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	httpErr := hs.Shutdown(ctx)
	if httpErr != nil {
		log.Warn("in-flight requests did not finish in time", "err", httpErr)
		_ = hs.Close()
	}
	<-served
	srvErr := rs.shutdown(ctx)
	log.Info("stopped")
	return errors.Join(httpErr, srvErr)
}

// mainPriority is the -model checkpoint's pre-warming priority, above
// any -prewarm entry's.
const mainPriority = 1 << 20

// prewarmers pre-warm each replica's Server: the -model checkpoint first
// and pinned, then the -prewarm models; /ready waits for the main model
// on every replica.
type prewarmers []*prewarm.PreWarmer

func newPrewarmers(rs *replicas, o options, dir, id string, log *slog.Logger) (prewarmers, error) {
	main := prewarm.Model{Spec: engine.ModelSpec{ID: id, Path: dir, AdapterSlots: o.adapterSlots, MaxAdapterRank: o.adapterRank},
		Priority: mainPriority, Pin: true}
	var pws prewarmers
	for _, srv := range rs.servers {
		pw, err := prewarm.New(srv, append([]prewarm.Model{main}, o.prewarm...),
			prewarm.WithReadiness(prewarm.WhileWarming(mainPriority)), prewarm.WithLogger(log))
		if err != nil {
			pws.stop()
			return nil, err
		}
		pws = append(pws, pw)
	}
	return pws, nil
}

// start starts pre-warming on every replica and waits until the main
// model serves on all of them.
func (pws prewarmers) start(ctx context.Context, log *slog.Logger) error {
	start := time.Now()
	for _, pw := range pws {
		if err := pw.Start(ctx); err != nil {
			return err
		}
	}
	for _, pw := range pws {
		if err := pw.Ready(ctx); err != nil {
			return err
		}
	}
	log.Info("model ready", "took", time.Since(start).Round(time.Millisecond))
	return nil
}

func (pws prewarmers) checkReady(ctx context.Context) error {
	for _, pw := range pws {
		if err := pw.CheckReady(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (pws prewarmers) stop() {
	for _, pw := range pws {
		pw.Stop()
	}
}

// checkpoint returns the directory to serve and the model id: -model, or
// the generated test checkpoint in a temporary directory.
func checkpoint(o options) (dir, id string, cleanup func(), err error) {
	if o.model != "" {
		id = o.modelID
		if id == "" {
			id = filepath.Base(filepath.Clean(o.model))
		}
		return o.model, id, func() {}, nil
	}
	dir, err = os.MkdirTemp("", "mlxserving-tiny-*")
	if err != nil {
		return "", "", nil, err
	}
	cleanup = func() { _ = os.RemoveAll(dir) }
	if err := writeTestModel(dir); err != nil {
		cleanup()
		return "", "", nil, err
	}
	id = o.modelID
	if id == "" {
		id = "tiny"
	}
	return dir, id, cleanup, nil
}

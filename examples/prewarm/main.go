// Command prewarm pre-warms two models by priority, prints their progress,
// and serves them over the OpenAI API: the template for a program that must
// answer its first requests at full speed.
//
//	go run ./examples/prewarm                  # two generated test models
//	go run ./examples/prewarm -engine sim      # the simulated engine
//	curl -s 127.0.0.1:8080/v1/models
//
// Without -chat and -code it writes two of the project's small random-weight
// checkpoints (testmodel) to a temporary directory. "chat"
// (priority 10, pinned, warmed with a prompt) and "code" (priority 1) load
// and warm one after another, or together with -parallel 2; the server
// reports ready (/ready) as soon as "chat" is warm, while "code" may still
// be warming. The engine is the Python engine when python3 (on PATH or
// Debian's /usr/bin/python3) imports torch, otherwise the simulated
// engine, which it says. Ctrl-C stops it: pre-warming still under way is
// aborted and leaves nothing half-loaded.
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
	"syscall"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/engine/pyproc"
	"github.com/mlxserving/mlxserving/openai"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/testmodel"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, nil); err != nil {
		fmt.Fprintln(os.Stderr, "prewarm:", err)
		os.Exit(1)
	}
}

type options struct {
	addr, chat, code, engine, python string
	parallel                         int
	timeout                          time.Duration
	budget                           int64
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("prewarm", flag.ContinueOnError)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "address to listen on")
	fs.StringVar(&o.chat, "chat", "", "checkpoint of the high-priority model (default: a generated test model)")
	fs.StringVar(&o.code, "code", "", "checkpoint of the low-priority model (default: a generated test model)")
	fs.StringVar(&o.engine, "engine", "auto", "auto, pyproc or sim")
	fs.StringVar(&o.python, "python", "", "python interpreter for the pyproc engine")
	fs.IntVar(&o.parallel, "parallel", 1, "models loaded and warmed at once")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "limit on loading plus warming one model")
	fs.Int64Var(&o.budget, "memory-budget", 0, "memory budget of the loaded models in bytes (0: none)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch o.engine {
	case "auto", "pyproc", "sim":
	default:
		return o, fmt.Errorf("-engine %q: want auto, pyproc or sim", o.engine)
	}
	return o, nil
}

// run pre-warms, serves until ctx ends, then shuts down. Progress goes to
// out; listening, if not nil, receives the address once "chat" is ready.
func run(ctx context.Context, args []string, out io.Writer, listening chan<- string) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelWarn}))
	chat, code, cleanup, err := checkpoints(o)
	if err != nil {
		return err
	}
	defer cleanup()
	eng, err := openEngine(ctx, o, out)
	if err != nil {
		return err
	}
	defer func() { _ = eng.Close() }()
	srv, err := mlxserving.New(eng, mlxserving.WithLogger(log), mlxserving.WithMemoryBudget(o.budget))
	if err != nil {
		return err
	}
	defer func() { _ = srv.Close() }()

	models := []prewarm.Model{
		{Spec: engine.ModelSpec{ID: "code", Path: code}, Priority: 1},
		{Spec: engine.ModelSpec{ID: "chat", Path: chat}, Priority: 10, Pin: true, Prompts: []string{"Hello! Who are you?"}},
	}
	start := time.Now()
	pw, err := prewarm.New(srv, models, prewarm.WithConcurrency(o.parallel), prewarm.WithModelTimeout(o.timeout),
		prewarm.WithReadiness(prewarm.WhileWarming(10)), prewarm.WithOnChange(func(p prewarm.ModelProgress) {
			printProgress(out, start, p)
		}))
	if err != nil {
		return err
	}
	defer pw.Stop()
	if err := pw.Start(ctx); err != nil {
		return err
	}

	h, err := openai.New(srv, openai.WithReadyCheck(pw.CheckReady))
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		<-served
	}()

	if err := pw.Ready(ctx); err != nil {
		return fmt.Errorf("chat did not get ready: %w", err)
	}
	fmt.Fprintf(out, "%6.2fs serving on http://%s (/ready is 200; code may still be warming)\n", time.Since(start).Seconds(), ln.Addr())
	if listening != nil {
		listening <- ln.Addr().String()
	}
	select {
	case <-pw.Done():
		printSummary(out, pw.Status())
	case <-ctx.Done():
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-served:
		return err
	}
}

func printProgress(out io.Writer, start time.Time, p prewarm.ModelProgress) {
	line := fmt.Sprintf("%6.2fs %-5s %-8s", time.Since(start).Seconds(), p.ID, p.Phase)
	switch p.Phase {
	case prewarm.Warming:
		line += fmt.Sprintf(" loaded in %v", p.LoadTime.Round(time.Millisecond))
	case prewarm.Ready:
		line += fmt.Sprintf(" warmed in %v (batch sizes %v, %d warm-up tokens)", p.WarmTime.Round(time.Millisecond), p.Warm.BatchSizes, p.Warm.Tokens)
	case prewarm.Failed, prewarm.Aborted:
		line += fmt.Sprintf(" %v", p.Err)
	}
	fmt.Fprintln(out, line)
}

func printSummary(out io.Writer, st prewarm.Status) {
	fmt.Fprintf(out, "pre-warming done: %d of %d models settled\n", st.Settled, len(st.Models))
	for _, m := range st.Models {
		fmt.Fprintf(out, "  %-5s priority %2d  %-7s load %-8v warm %v\n", m.ID, m.Priority, m.Phase,
			m.LoadTime.Round(time.Millisecond), m.WarmTime.Round(time.Millisecond))
	}
}

// checkpoints returns the two checkpoint directories, writing generated
// test models for those not given.
func checkpoints(o options) (chat, code string, cleanup func(), err error) {
	chat, code, cleanup = o.chat, o.code, func() {}
	if chat != "" && code != "" {
		return chat, code, cleanup, nil
	}
	dir, err := os.MkdirTemp("", "mlxserving-prewarm-*")
	if err != nil {
		return "", "", nil, err
	}
	cleanup = func() { _ = os.RemoveAll(dir) }
	for i, p := range []*string{&chat, &code} {
		if *p != "" {
			continue
		}
		*p = fmt.Sprintf("%s/model%d", dir, i)
		cfg := testmodel.Tiny()
		cfg.Seed = int64(i + 1)
		if err := os.Mkdir(*p, 0o755); err == nil {
			err = testmodel.Write(*p, cfg)
		}
		if err != nil {
			cleanup()
			return "", "", nil, err
		}
	}
	return chat, code, cleanup, nil
}

// systemPython is Debian's system interpreter, where apt's python3-torch
// lives.
const systemPython = "/usr/bin/python3"

// openEngine starts the Python engine (auto and pyproc) or the simulated
// one (sim, or auto when Python with torch is missing).
func openEngine(ctx context.Context, o options, out io.Writer) (engine.Engine, error) {
	if o.engine != "sim" {
		pythons := []string{o.python}
		if o.python == "" {
			pythons = []string{"python3", systemPython}
		}
		var errs []error
		for _, py := range pythons {
			eng, err := pyproc.New(ctx, pyproc.WithPython(py))
			if err == nil {
				return eng, nil
			}
			errs = append(errs, err)
		}
		if o.engine == "pyproc" {
			return nil, errors.Join(errs...)
		}
	}
	cfg := testmodel.Tiny()
	fmt.Fprintln(out, "SIMULATED ENGINE: pseudo-tokens from enginetest.Sim, not a model's output")
	return enginetest.NewSim(enginetest.WithVocabSize(cfg.Vocab), enginetest.WithContextLength(cfg.ContextLength),
		enginetest.WithStepTime(time.Millisecond, 0), enginetest.WithLoadTime(200*time.Millisecond),
		enginetest.WithCompileTime(20*time.Millisecond))
}

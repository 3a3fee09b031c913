// Command cluster runs a small mlxserving cluster on this machine with one
// command: an embedded NATS server, several instances (each a Server
// serving itself over NATS with natsbackend.Serve), a
// balancer.LoadBalancer that finds them with natsbackend.Discover, and
// the OpenAI API over the balancer.
//
//	go run ./examples/cluster                 # 3 instances, simulated engine, :8080
//	go run ./examples/cluster -engine pyproc  # the Python engine (needs torch)
//
//	curl -s 127.0.0.1:8080/v1/chat/completions -d '{"model":"tiny",
//	  "messages":[{"role":"user","content":"Hello"}],"max_tokens":16}'
//
// By default the instances run the simulated engine (enginetest.Sim):
// pseudo-tokens, not a model's output, as the logs say. With -engine
// pyproc each instance runs the project's tiny test checkpoint on PyTorch.
// /metrics serves the balancer's load under vLLM's names. SIGTERM or
// SIGINT stop everything.
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

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/engine/pyproc"
	"github.com/mlxserving/mlxserving/openai"
	"github.com/mlxserving/mlxserving/openai/vllm"
	"github.com/mlxserving/mlxserving/testmodel"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

type options struct {
	addr      string
	instances int
	engine    string
	python    string
	simStep   time.Duration
	verbose   bool
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("cluster", flag.ContinueOnError)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "address of the OpenAI HTTP endpoint")
	fs.IntVar(&o.instances, "instances", 3, "instances to start")
	fs.StringVar(&o.engine, "engine", "sim", "engine of each instance: sim (simulated) or pyproc (PyTorch)")
	fs.StringVar(&o.python, "python", "/usr/bin/python3", "Python interpreter with torch, for -engine pyproc")
	fs.DurationVar(&o.simStep, "sim-step", 5*time.Millisecond, "step time of the simulated engine")
	fs.BoolVar(&o.verbose, "v", false, "debug logging")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case o.instances < 1:
		return o, fmt.Errorf("-instances %d: want at least 1", o.instances)
	case o.engine != "sim" && o.engine != "pyproc":
		return o, fmt.Errorf("-engine %q: want sim or pyproc", o.engine)
	case o.simStep < 0:
		return o, fmt.Errorf("-sim-step %v: must not be negative", o.simStep)
	}
	return o, nil
}

// run serves until ctx ends. If listening is not nil it receives the HTTP
// address once the balancer has found every instance.
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

	dir, err := os.MkdirTemp("", "mlxserving-cluster-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := testmodel.Write(dir, testmodel.Tiny()); err != nil {
		return err
	}

	ns, err := startNATS()
	if err != nil {
		return err
	}
	defer func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	}()
	log.Info("embedded NATS server", "url", ns.ClientURL())

	for i := range o.instances {
		name := fmt.Sprintf("instance-%d", i+1)
		stop, err := startInstance(ctx, o, name, dir, ns.ClientURL(), log.With("instance", name))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		defer stop()
	}

	// The balancer's metrics (routing, failovers, breakers per instance) and
	// the vLLM-named load gauges are served on /metrics.
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	lb, err := balancer.New(balancer.WithLogger(log), balancer.WithMeterProvider(mp))
	if err != nil {
		return err
	}
	defer lb.Close()
	bnc, err := nats.Connect(ns.ClientURL(), nats.Name("balancer"), nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer bnc.Close()
	d, err := natsbackend.Discover(ctx, bnc, lb, natsbackend.WithLogger(log))
	if err != nil {
		return err
	}
	defer d.Close()
	if err := waitInstances(ctx, d, o.instances); err != nil {
		return err
	}

	gauges, err := vllm.LoadCollector(lb)
	if err != nil {
		return err
	}
	reg.MustRegister(gauges)
	h, err := openai.New(lb, openai.WithLogger(log), openai.WithMeterProvider(mp), openai.WithMetricsHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
	if err != nil {
		return err
	}
	return serve(ctx, o.addr, h, log, listening)
}

func startNATS() (*server.Server, error) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		return nil, err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded NATS server did not start")
	}
	return ns, nil
}

// startInstance starts one Server with the tiny checkpoint and serves it
// over NATS. stop ends it.
func startInstance(ctx context.Context, o options, name, dir, natsURL string, log *slog.Logger) (stop func(), err error) {
	var eng engine.Engine
	if o.engine == "pyproc" {
		eng, err = pyproc.New(ctx, pyproc.WithLogger(log), pyproc.WithPython(o.python))
	} else {
		cfg := testmodel.Tiny()
		log.Warn("SIMULATED ENGINE: serving pseudo-tokens from enginetest.Sim, not a model's output", "step", o.simStep)
		eng, err = enginetest.NewSim(enginetest.WithVocabSize(cfg.Vocab), enginetest.WithContextLength(cfg.ContextLength),
			enginetest.WithStepTime(o.simStep, 0))
	}
	if err != nil {
		return nil, err
	}
	var closers []func()
	stop = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	closers = append(closers, func() { _ = eng.Close() })
	srv, err := mlxserving.New(eng, mlxserving.WithLogger(log))
	if err != nil {
		stop()
		return nil, err
	}
	closers = append(closers, func() { _ = srv.Close() })
	if err := srv.LoadModel(ctx, engine.ModelSpec{ID: "tiny", Path: dir}); err != nil {
		stop()
		return nil, err
	}
	nc, err := nats.Connect(natsURL, nats.Name(name), nats.MaxReconnects(-1))
	if err != nil {
		stop()
		return nil, err
	}
	closers = append(closers, nc.Close)
	svc, err := natsbackend.Serve(nc, name, srv, natsbackend.WithLogger(log))
	if err != nil {
		stop()
		return nil, err
	}
	closers = append(closers, func() { _ = svc.Stop() })
	log.Info("instance serving over NATS", "engine", o.engine, "id", svc.ID())
	return stop, nil
}

func waitInstances(ctx context.Context, d *natsbackend.Discovery, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for len(d.Instances()) < n {
		select {
		case <-ctx.Done():
			return fmt.Errorf("balancer found %d of %d instances: %w", len(d.Instances()), n, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

func serve(ctx context.Context, addr string, h http.Handler, log *slog.Logger, listening chan<- string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()
	log.Info("OpenAI API over the balancer", "addr", l.Addr().String())
	if listening != nil {
		listening <- l.Addr().String()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		return err
	}
	<-errc
	return nil
}

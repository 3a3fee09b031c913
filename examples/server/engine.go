package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/engine/mlx"
	"github.com/mlxserving/mlxserving/engine/pyproc"
	"github.com/mlxserving/mlxserving/testmodel"
)

// systemPython is Debian's system interpreter, tried when the python3 on
// PATH lacks torch.
const systemPython = "/usr/bin/python3"

func writeTestModel(dir string) error {
	return testmodel.Write(dir, testmodel.Tiny())
}

// openEngine starts the engine -engine names; "auto" tries the Python
// engine, then MLX, then falls back to the simulated engine.
func openEngine(ctx context.Context, o options, dir string, log *slog.Logger) (engine.Engine, error) {
	switch o.engine {
	case "pyproc":
		return openPyproc(ctx, o, log)
	case "mlx":
		return mlx.New(mlx.WithLogger(log))
	case "sim":
		return openSim(o, dir, log)
	}
	eng, err := openPyproc(ctx, o, log)
	if err == nil || o.tp > 1 || len(o.gpus) > 0 || o.kvCacheDtype == "fp8" { // only the Python engine places GPUs and stores FP8 KV
		return eng, err
	}
	log.Info("python engine unavailable", "err", err)
	if o.python == "" {
		// Debian's python3-torch installs into the system interpreter, which
		// need not be the python3 first on PATH (pyenv, virtualenvs).
		if _, statErr := os.Stat(systemPython); statErr == nil {
			o.python = systemPython
			if eng, err := openPyproc(ctx, o, log); err == nil {
				return eng, nil
			}
		}
	}
	m, err := mlx.New(mlx.WithLogger(log))
	if err == nil {
		return m, nil
	}
	log.Info("mlx engine unavailable", "err", err)
	return openSim(o, dir, log)
}

func openPyproc(ctx context.Context, o options, log *slog.Logger) (engine.Engine, error) {
	opts := []pyproc.Option{pyproc.WithLogger(log)}
	if o.python != "" {
		opts = append(opts, pyproc.WithPython(o.python))
	}
	if o.lookahead > 0 {
		opts = append(opts, pyproc.WithLookahead(o.lookahead))
	}
	if o.quantize != "" {
		opts = append(opts, pyproc.WithQuantize(o.quantize))
	}
	if o.kvCacheDtype != "" && o.kvCacheDtype != "auto" {
		opts = append(opts, pyproc.WithKVCacheDtype(o.kvCacheDtype))
	}
	if o.tp > 1 {
		opts = append(opts, pyproc.WithTensorParallel(o.tp))
	}
	if len(o.gpus) > 0 {
		opts = append(opts, pyproc.WithGPUs(o.gpus))
	}
	// -token-budget sizes the worker's steps (its prompt-step graphs) as it
	// sizes the batcher's.
	opts = append(opts, pyproc.WithTuning(pyproc.Tuning{KVFraction: o.kvFraction, BlockSize: o.blockSize, DenseLoRA: o.loraDense,
		NoLoRASideStream: o.loraNoSideStream, StepTokens: max(o.tokenBudget, 0),
		TraceDir: startupTrace(o), TraceSkip: o.traceSkip, TraceSteps: o.traceSteps}))
	return pyproc.New(ctx, opts...)
}

// openSim starts the simulated engine sized like the checkpoint, so its
// pseudo-tokens stay inside the tokenizer's vocabulary.
func openSim(o options, dir string, log *slog.Logger) (engine.Engine, error) {
	cfg, err := readConfig(dir)
	if err != nil {
		return nil, err
	}
	log.Warn("SIMULATED ENGINE: serving pseudo-tokens from enginetest.Sim, not a model's output",
		"vocab", cfg.VocabSize, "context", cfg.MaxPositionEmbeddings, "step", o.simStep)
	return enginetest.NewSim(enginetest.WithVocabSize(cfg.VocabSize), enginetest.WithContextLength(cfg.MaxPositionEmbeddings),
		enginetest.WithStepTime(o.simStep, 0))
}

type modelConfig struct {
	VocabSize             int `json:"vocab_size"`
	MaxPositionEmbeddings int `json:"max_position_embeddings"`
}

func readConfig(dir string) (modelConfig, error) {
	var c modelConfig
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%s: %w", filepath.Join(dir, "config.json"), err)
	}
	if c.VocabSize <= 0 || c.MaxPositionEmbeddings <= 0 {
		return c, fmt.Errorf("%s: vocab_size and max_position_embeddings must be positive", filepath.Join(dir, "config.json"))
	}
	return c, nil
}

// newMetrics builds a MeterProvider exporting to a registry of the
// server's own (never the global one), the /metrics handler over it, and
// the registry, for collectors of Prometheus's own.
func newMetrics() (*sdkmetric.MeterProvider, http.Handler, prometheus.Registerer, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	return mp, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), reg, nil
}

// startupTrace is Tuning.TraceDir: -trace-dir where -trace-steps asks for
// a trace from start-up, else none (the directory then serves
// /debug/trace alone).
func startupTrace(o options) string {
	if o.traceSteps > 0 {
		return o.traceDir
	}
	return ""
}

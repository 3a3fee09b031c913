package mlxserving

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/grammar"
	"github.com/mlxserving/mlxserving/merge"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/scheduler"
	"github.com/mlxserving/mlxserving/session"
)

// Errors of the Server itself. Errors from lower layers (engine, scheduler,
// batcher) come through wrapped and keep their identity for errors.Is/As.
var (
	// ErrServerClosed is returned for requests after Close or Shutdown.
	// It wraps engine.ErrClosed, so a load balancer in front of several
	// Servers counts a closed one as a failing backend.
	ErrServerClosed error = closedError("server closed")
	// ErrModelExists is returned by LoadModel for an id already loaded.
	ErrModelExists = errors.New("model already loaded")
	// ErrNoTokenizer is returned for a text prompt to a model whose
	// checkpoint has no tokenizer.json.
	ErrNoTokenizer = retry.NewError(retry.CodeUnsupportedModel, "model has no tokenizer")
	// ErrModelUnloaded ends requests still queued for a model that is
	// being unloaded.
	ErrModelUnloaded = retry.NewError(retry.CodeUnavailable, "model unloaded")
)

// closedError is a closed-server sentinel that unwraps to engine.ErrClosed.
type closedError string

func (e closedError) Error() string { return string(e) }
func (e closedError) Unwrap() error { return engine.ErrClosed }

// Server serves models loaded into one engine: it validates requests,
// queues them by priority and runs each model's sequences in its own
// continuous batcher.
//
// A Server is safe for concurrent use. The engine stays the caller's: Close
// unloads the Server's models but does not close the engine.
type Server struct {
	eng      engine.Engine
	cfg      config
	metrics  *metrics
	sessions *session.Registry

	merger *merge.Merger // nil when merging is off
	loads  atomic.Uint64 // model loads, for revisions
	mgr    *prewarm.Manager

	mu       sync.RWMutex
	models   map[string]*model        // loaded models; nil while loading
	explicit map[string]bool          // models added by LoadModel
	adapters map[string]*adapterEntry // LoRA adapters by name (adapters.go); nil entry while loading
	closed   bool
}

// New returns a Server over eng. Load models with LoadModel.
func New(eng engine.Engine, opts ...Option) (*Server, error) {
	if eng == nil {
		return nil, errors.New("mlxserving: engine is nil")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("mlxserving: %w", err)
		}
	}
	// Options used at each model load are checked here, so their errors
	// surface at New and not at the first LoadModel.
	if _, err := scheduler.New[*batcher.Sequence](cfg.schedulerOpts...); err != nil {
		return nil, fmt.Errorf("mlxserving: scheduler options: %w", err)
	}
	if err := batcher.CheckOptions(cfg.batcherOpts...); err != nil {
		return nil, fmt.Errorf("mlxserving: batcher options: %w", err)
	}
	if err := session.CheckCacheOptions(cfg.cacheOpts...); err != nil {
		return nil, fmt.Errorf("mlxserving: prefix cache options: %w", err)
	}
	s := &Server{eng: eng, cfg: cfg, models: make(map[string]*model), explicit: make(map[string]bool),
		adapters: make(map[string]*adapterEntry)}
	if err := s.build(&cfg); err != nil {
		s.closeServices()
		return nil, fmt.Errorf("mlxserving: %w", err)
	}
	return s, nil
}

// build builds the Server's services in order; on an error, closeServices
// ends those already built.
func (s *Server) build(cfg *config) (err error) {
	if cfg.merging {
		if s.merger, err = merge.New(cfg.mergeOpts...); err != nil {
			return err
		}
	}
	if s.metrics, err = newMetrics(cfg.meterProvider, cfg.metricAttrs, s); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	if s.sessions, err = s.newRegistry(); err != nil {
		return fmt.Errorf("session options: %w", err)
	}
	s.mgr, err = newManager(s, cfg)
	return err
}

// closeServices ends what build built, once the models are gone: the
// session registry, the merger (its generations have ended with their
// models) and the metrics' registration.
func (s *Server) closeServices() {
	if s.sessions != nil {
		s.sessions.Close()
	}
	if s.merger != nil {
		s.merger.Close()
	}
	if s.metrics != nil && s.metrics.registration != nil {
		_ = s.metrics.registration.Unregister()
	}
}

// Option configures a Server.
type Option func(*config) error

type config struct {
	logger        *slog.Logger
	meterProvider metric.MeterProvider
	metricAttrs   []attribute.KeyValue
	schedulerOpts []scheduler.Option
	batcherOpts   []batcher.Option
	sessionOpts   []session.Option
	cacheOpts     []session.CacheOption
	noPrefixCache bool
	deadlines     retry.Deadlines
	merging       bool
	mergeOpts     []merge.Option
	managerOpts   []prewarm.ManagerOption
	grammarLimits grammar.Limits
}

func defaultConfig() config {
	return config{logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// WithLogger sets the logger. The default discards.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("logger is nil")
		}
		c.logger = l
		return nil
	}
}

// WithSchedulerOptions configures each model's priority scheduler: queue
// bounds, tier deadlines, aging, rate limits, preemption.
func WithSchedulerOptions(opts ...scheduler.Option) Option {
	return func(c *config) error {
		c.schedulerOpts = append(c.schedulerOpts, opts...)
		return nil
	}
}

// WithBatcherOptions configures each model's continuous batcher: batch
// limit, token budget, adaptive sizing.
func WithBatcherOptions(opts ...batcher.Option) Option {
	return func(c *config) error {
		c.batcherOpts = append(c.batcherOpts, opts...)
		return nil
	}
}

// WithDeadlines sets the deadlines of requests that do not set their own
// (Params.Deadlines, field by field). The default sets none.
func WithDeadlines(d retry.Deadlines) Option {
	return func(c *config) error {
		if err := d.Validate(); err != nil {
			return err
		}
		c.deadlines = d
		return nil
	}
}

// Models describes the loaded models, sorted by id.
func (s *Server) Models() []engine.Info {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]engine.Info, 0, len(s.models))
	for _, m := range s.models {
		if m != nil {
			out = append(out, m.info)
		}
	}
	slices.SortFunc(out, func(a, b engine.Info) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// ModelStats is a snapshot of one model's serving state.
type ModelStats struct {
	Batcher batcher.Stats
	Queue   scheduler.Stats
	// PrefixCache counts prompt tokens looked up and reused from saved KV
	// (cached tokens) and what is saved; zero with WithoutPrefixCache.
	PrefixCache session.CacheStats
	// Breakers are the circuit breakers of the engine's workers, when the
	// engine has them (engine.WorkerBreakers; pyproc does).
	Breakers []retry.Status
}

// Stats returns a snapshot per loaded model.
func (s *Server) Stats() map[string]ModelStats {
	var breakers []retry.Status
	if be, ok := s.eng.(engine.WorkerBreakers); ok {
		breakers = be.Breakers()
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[string]ModelStats, len(s.models))
	for id, m := range s.models {
		if m == nil {
			continue
		}
		out[id] = ModelStats{Batcher: m.batcher.Stats(), Queue: m.queue.Stats(), Breakers: breakers, PrefixCache: m.prefixStats()}
	}
	return out
}

// Shutdown stops accepting requests, lets queued and running ones finish,
// then unloads every model. If ctx ends first, what is left ends with an
// error and Shutdown returns ctx.Err().
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true // from here on, a load cut short reports ErrServerClosed
	s.mu.Unlock()
	_ = s.mgr.Close() // aborts loads under way first
	models := s.closeAll()
	var errs []error
	for _, m := range models {
		errs = append(errs, m.shutdown(ctx))
	}
	s.closeServices()
	return errors.Join(errs...)
}

// Close stops the Server at once: requests in flight end with an error and
// every model is unloaded. It returns when the batchers have stopped.
func (s *Server) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Shutdown(ctx)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func (s *Server) closeAll() []*model {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	models := make([]*model, 0, len(s.models))
	for id, m := range s.models {
		models = append(models, m)
		delete(s.models, id)
	}
	return models
}

func (s *Server) idsLocked() []string {
	ids := make([]string, 0, len(s.models))
	for id := range s.models {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// ModelNotFoundError names the model a request asked for and the ones that
// are loaded.
type ModelNotFoundError struct {
	Model  string
	Loaded []string
}

func (e *ModelNotFoundError) Error() string {
	return fmt.Sprintf("model %q is not loaded (loaded: %v)", e.Model, e.Loaded)
}

// Unwrap returns engine.ErrModelNotFound.
func (e *ModelNotFoundError) Unwrap() error { return engine.ErrModelNotFound }

// MergeStats reports what request merging did; the zero value when it is
// off (see WithMerging).
func (s *Server) MergeStats() merge.Stats {
	if s.merger == nil {
		return merge.Stats{}
	}
	return s.merger.Stats()
}

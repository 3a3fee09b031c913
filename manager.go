package mlxserving

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/retry"
)

// WithMemoryBudget bounds the memory of the loaded models, in bytes, as the
// engine reports it (weights + KV): loading a model that does not fit
// first unloads the least recently used idle models that are not pinned;
// when none can go, the request fails with a *prewarm.BudgetError (HTTP
// 503 with Retry-After). Zero, the default, is no budget.
func WithMemoryBudget(bytes int64) Option {
	return WithManagerOptions(prewarm.WithBudget(bytes))
}

// WithManagerOptions configures the Server's model manager: memory budget,
// default keep-alive of idle models, back-off after failed loads, load
// timeout (see package prewarm).
func WithManagerOptions(opts ...prewarm.ManagerOption) Option {
	return func(c *config) error {
		c.managerOpts = append(c.managerOpts, opts...)
		return nil
	}
}

func newManager(s *Server, cfg *config) (*prewarm.Manager, error) {
	opts := []prewarm.ManagerOption{prewarm.WithLogger(cfg.logger)}
	if cfg.meterProvider != nil {
		opts = append(opts, prewarm.WithMeterProvider(cfg.meterProvider))
	}
	return prewarm.NewManager(serverHost{s}, append(opts, cfg.managerOpts...)...)
}

// RegisterModel makes m known without loading it: the first request for it
// loads it (waiting within its context), and it unloads again after its
// keep-alive or to make room under the memory budget unless pinned.
func (s *Server) RegisterModel(m prewarm.Model) error {
	s.mu.RLock()
	explicit, closed := s.explicit[m.ID()], s.closed
	s.mu.RUnlock()
	switch {
	case closed:
		return ErrServerClosed
	case explicit:
		return fmt.Errorf("%w: %q was loaded with LoadModel", ErrModelExists, m.ID())
	}
	return s.managerErr(m.ID(), s.mgr.Register(m))
}

// Preload registers m (unless LoadModel added it) and loads it now,
// sharing a load of it already under way. It implements prewarm.Target.
func (s *Server) Preload(ctx context.Context, m prewarm.Model) error {
	if err := s.RegisterModel(m); err != nil && !errors.Is(err, ErrModelExists) {
		return err
	}
	return s.managerErr(m.ID(), s.mgr.Acquire(ctx, m.ID(), nil))
}

// ModelStatus describes every known model: loaded, loading, unloaded,
// failed (with the error and when it may be retried), memory, keep-alive.
func (s *Server) ModelStatus() []prewarm.ModelStatus {
	st := s.mgr.Status()
	return append(st, s.adapterStatus(st)...)
}

// Memory returns the bytes the loaded models take and the memory budget
// (0: none).
func (s *Server) Memory() (used, budget int64) { return s.mgr.Memory() }

// warmTokens is the length of a warm-up generation.
const warmTokens = 8

// warmUpKey marks the context of a warm-up generation: the server's request
// deadlines (WithDeadlines) do not apply to it, since a cold first step
// (kernel builds, graph capture, allocator growth) may take longer than any
// deadline set for requests; the caller's context still bounds it.
type warmUpKey struct{}

// requestDeadlines are the server-wide deadlines for a request started
// with ctx: none for warm-ups.
func (s *Server) requestDeadlines(ctx context.Context) retry.Deadlines {
	if warm, _ := ctx.Value(warmUpKey{}).(bool); warm {
		return retry.Deadlines{}
	}
	return s.cfg.deadlines
}

// WarmModel warms a loaded model (loading it if it is only registered):
// the engine's own warm-up when its model implements engine.Warmer, then
// one short generation per prompt at background priority (from a few
// token ids when there are none). It implements prewarm.Target.
func (s *Server) WarmModel(ctx context.Context, id string, prompts []string) (prewarm.WarmReport, error) {
	var rep prewarm.WarmReport
	m, err := s.acquire(ctx, id, nil)
	if err != nil {
		return rep, err
	}
	defer s.release(m)
	if w, ok := m.engine.(engine.Warmer); ok {
		if rep.BatchSizes, err = w.Warm(ctx); err != nil {
			return rep, fmt.Errorf("warm model %q: %w", id, err)
		}
	}
	reqs := make([]api.Request, 0, max(1, len(prompts)))
	for _, p := range prompts {
		reqs = append(reqs, api.Request{Model: id, Prompt: p})
	}
	if len(reqs) == 0 {
		reqs = append(reqs, api.Request{Model: id, PromptTokens: []int32{1, 2, 3}})
	}
	ctx = context.WithValue(ctx, warmUpKey{}, true)
	if m.info.Encoder {
		// An encoder only embeds: its warm-up is an embedding of each
		// prompt through the whole stack.
		return rep, s.warmEmbed(ctx, id, reqs, &rep)
	}
	for _, r := range reqs {
		r.Params = api.Params{MaxTokens: warmTokens, IgnoreEOS: true, Priority: api.Background}
		st, err := s.Generate(ctx, r)
		if err != nil {
			return rep, fmt.Errorf("warm model %q: %w", id, err)
		}
		res, err := st.Collect()
		if err != nil {
			return rep, fmt.Errorf("warm model %q: %w", id, err)
		}
		rep.Generations++
		rep.Tokens += len(res.Tokens)
	}
	return rep, nil
}

// warmEmbed embeds each warm-up prompt at background priority.
func (s *Server) warmEmbed(ctx context.Context, id string, reqs []api.Request, rep *prewarm.WarmReport) error {
	for _, r := range reqs {
		in := api.EmbedInput{Text: r.Prompt, Tokens: r.PromptTokens}
		res, err := s.Embed(ctx, api.EmbedRequest{Model: id, Inputs: []api.EmbedInput{in}, Priority: api.Background, Truncate: true})
		if err != nil {
			return fmt.Errorf("warm model %q: %w", id, err)
		}
		rep.Generations++
		rep.Tokens += res.PromptTokens
	}
	return nil
}

// acquire returns the loaded model id, loading it first when it is only
// registered, and counts a request on it until release: a model with
// requests counted is never evicted.
func (s *Server) acquire(ctx context.Context, id string, keepAlive *time.Duration) (*model, error) {
	for {
		if err := s.mgr.Acquire(ctx, id, keepAlive); err != nil {
			return nil, s.managerErr(id, err)
		}
		s.mu.RLock()
		if s.closed {
			s.mu.RUnlock()
			return nil, ErrServerClosed
		}
		m := s.models[id]
		if m != nil {
			m.active.Add(1)
		}
		s.mu.RUnlock()
		if m != nil {
			return m, nil
		}
		// Evicted between the two steps: load it again.
	}
}

// release ends a request counted by acquire.
func (s *Server) release(m *model) {
	if m.active.Add(-1) == 0 {
		s.mgr.Idle(m.info.ID)
	}
}

// releaseWhenDone releases a request once its sequence has ended, also
// when nobody reads its stream.
func releaseWhenDone(release func(), done <-chan struct{}) {
	<-done
	release()
}

// managerErr gives the manager's errors the Server's types.
func (s *Server) managerErr(id string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, prewarm.ErrUnknownModel):
		s.mu.RLock()
		defer s.mu.RUnlock()
		return &ModelNotFoundError{Model: id, Loaded: s.idsLocked()}
	case errors.Is(err, prewarm.ErrClosed):
		return ErrServerClosed
	case errors.Is(err, prewarm.ErrAborted):
		s.mu.RLock()
		closed := s.closed
		s.mu.RUnlock()
		if closed { // cut short by Close or Shutdown
			return fmt.Errorf("%w: %w", ErrServerClosed, err)
		}
	}
	return err
}

// serverHost is the Server as the manager's prewarm.Host. Its verbs load
// and unload behind the manager's back (no budget, no registration), so
// they stay off Server's exported API: callers load with LoadModel,
// RegisterModel or Preload, which go through the manager.
type serverHost struct{ s *Server }

// Load loads spec and starts serving it.
func (h serverHost) Load(ctx context.Context, spec engine.ModelSpec) (engine.Info, error) {
	s := h.s
	if err := s.reserve(spec.ID); err != nil {
		return engine.Info{}, err
	}
	m, err := s.load(ctx, spec)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil || s.closed {
		delete(s.models, spec.ID)
		if err == nil {
			m.close(ErrServerClosed)
			return engine.Info{}, ErrServerClosed
		}
		return engine.Info{}, err
	}
	s.models[spec.ID] = m
	s.cfg.logger.Info("model loaded", "model", spec.ID, "engine", m.info.Engine, "context", m.info.ContextLength,
		"kv_capacity", m.info.KVCapacity, "max_batch", m.info.MaxBatch, "bytes", m.info.MemoryBytes())
	return m.info, nil
}

// Unload stops serving the model; with idleOnly only when no request is
// counted on it.
func (h serverHost) Unload(ctx context.Context, id string, idleOnly bool) error {
	s := h.s
	s.mu.Lock()
	m := s.models[id]
	if m == nil {
		s.mu.Unlock()
		return &ModelNotFoundError{Model: id}
	}
	if idleOnly && m.active.Load() > 0 {
		s.mu.Unlock()
		return prewarm.ErrBusy
	}
	delete(s.models, id)
	s.mu.Unlock()
	return m.shutdown(ctx)
}

// Busy reports whether requests are counted on the model.
func (h serverHost) Busy(id string) bool {
	h.s.mu.RLock()
	defer h.s.mu.RUnlock()
	m := h.s.models[id]
	return m != nil && m.active.Load() > 0
}

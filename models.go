package mlxserving

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"

	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/tokenizer"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/scheduler"
	"github.com/mlxserving/mlxserving/session"
)

// model is one loaded model with its queue and batcher.
type model struct {
	info    engine.Info
	engine  engine.Model
	tok     *tokenizer.Tokenizer // nil when the checkpoint has none
	eos     []int32              // the tokenizer's end tokens the engine does not already stop on
	queue   *scheduler.PriorityScheduler[*batcher.Sequence]
	batcher *batcher.ContinuousBatcher
	cache   *session.PrefixCache // nil with WithoutPrefixCache
	// revision names the checkpoint and engine behind this load, so merged
	// and cached responses never cross different checkpoints.
	revision string
	vocab    vocabOnce    // the tokenizer's vocabulary for constrained decoding
	active   atomic.Int64 // requests from acquire to the end of their sequence
}

// LoadModel loads the checkpoint at spec.Path into the engine under spec.ID
// and starts serving it. The tokenizer comes from the checkpoint's
// tokenizer.json when there is one; without it the model serves token-id
// prompts only. A model loaded this way is pinned: it stays loaded until
// UnloadModel, whatever the memory budget and keep-alive. If ctx ends
// first, the load is cancelled and nothing of it stays loaded.
func (s *Server) LoadModel(ctx context.Context, spec engine.ModelSpec) error {
	id := spec.ID
	if id == "" {
		return &engine.InvalidParamError{Param: "model", Reason: "model id is empty"}
	}
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return ErrServerClosed
	case s.explicit[id]:
		s.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrModelExists, id)
	}
	s.explicit[id] = true
	s.mu.Unlock()
	err := s.mgr.Register(prewarm.Model{Spec: spec, Pin: true, KeepAlive: -1})
	if err == nil {
		err = s.mgr.Acquire(ctx, id, nil)
	}
	if err == nil {
		return nil
	}
	_ = s.mgr.Forget(context.WithoutCancel(ctx), id)
	s.mu.Lock()
	delete(s.explicit, id)
	s.mu.Unlock()
	var le *prewarm.LoadError
	if errors.As(err, &le) {
		return fmt.Errorf("load model %q: %w", id, le.Err)
	}
	return s.managerErr(id, err)
}

// reserve claims id while it loads, so concurrent loads of one id fail fast.
func (s *Server) reserve(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrServerClosed
	}
	if _, ok := s.models[id]; ok {
		return fmt.Errorf("%w: %q", ErrModelExists, id)
	}
	s.models[id] = nil
	return nil
}

func (s *Server) load(ctx context.Context, spec engine.ModelSpec) (*model, error) {
	tok, err := loadTokenizer(spec.Path)
	if err != nil {
		return nil, err
	}
	em, err := s.eng.Load(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("load model %q: %w", spec.ID, err)
	}
	m := &model{info: em.Info(), engine: em, tok: tok,
		revision: revision(em.Info().Engine, spec.Path, s.loads.Add(1))}
	s.restoreAdapters(ctx, spec.ID, em)
	if tok != nil {
		for _, id := range tok.EOS() {
			if !slices.Contains(m.info.EOS, id) {
				m.eos = append(m.eos, id)
			}
		}
	}
	if m.queue, err = scheduler.New[*batcher.Sequence](s.cfg.schedulerOpts...); err != nil {
		_ = em.Close()
		return nil, err
	}
	run := em
	if !s.cfg.noPrefixCache {
		if m.cache, err = session.NewPrefixCache(em, append([]session.CacheOption{session.WithOnLost(s.lostKey), session.WithOnSaved(s.savedKey)}, s.cfg.cacheOpts...)...); err != nil {
			_ = em.Close()
			return nil, err
		}
		run = m.cache
	}
	opts := append([]batcher.Option{batcher.WithLogger(s.cfg.logger), batcher.WithStepObserver(s.metrics.stepObserver(spec.ID)),
		batcher.WithResumeObserver(s.metrics.resumeObserver(spec.ID))}, s.cfg.batcherOpts...)
	if m.batcher, err = batcher.New(run, m.queue, opts...); err != nil {
		_ = em.Close()
		return nil, err
	}
	return m, nil
}

// loadTokenizer reads dir's tokenizer, or returns nil when it has none.
func loadTokenizer(dir string) (*tokenizer.Tokenizer, error) {
	if dir == "" {
		return nil, nil
	}
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return tokenizer.Load(dir)
}

// UnloadModel stops serving a model: it stops taking requests for it, lets
// those already queued or running finish until ctx ends (then ends them
// with an error), and frees the model. A load under way is cancelled. A
// model added by LoadModel is forgotten; one added by RegisterModel or
// Preload stays known and loads again on its next request.
func (s *Server) UnloadModel(ctx context.Context, id string) error {
	s.mu.Lock()
	explicit := s.explicit[id]
	delete(s.explicit, id)
	s.mu.Unlock()
	if !s.mgr.Known(id) {
		return &ModelNotFoundError{Model: id}
	}
	if explicit {
		s.forgetAdapters(id)
		return s.managerErr(id, s.mgr.Forget(ctx, id))
	}
	return s.managerErr(id, s.mgr.Unload(ctx, id))
}

// shutdown drains the model's batcher until ctx ends, fails what is still
// queued, and closes the engine model.
func (m *model) shutdown(ctx context.Context) error {
	if m == nil {
		return nil
	}
	err := m.batcher.Shutdown(ctx)
	m.close(ErrModelUnloaded)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

func (m *model) close(reason error) {
	m.batcher.Close()
	m.queue.Close()
	for _, e := range m.queue.Drain() {
		e.Value.Fail(reason)
	}
	_ = m.engine.Close()
}

package mlxserving

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/tokenizer"
	"github.com/mlxserving/mlxserving/scheduler"
)

// model is one loaded model with its queue and batcher.
type model struct {
	info    engine.Info
	engine  engine.Model
	tok     *tokenizer.Tokenizer // nil when the checkpoint has none
	eos     []int32              // the tokenizer's end tokens the engine does not already stop on
	queue   *scheduler.PriorityScheduler[*batcher.Sequence]
	batcher *batcher.ContinuousBatcher
}

// LoadModel loads the checkpoint at spec.Path into the engine under spec.ID
// and starts serving it. The tokenizer comes from the checkpoint's
// tokenizer.json when there is one; without it the model serves token-id
// prompts only.
func (s *Server) LoadModel(ctx context.Context, spec engine.ModelSpec) error {
	if spec.ID == "" {
		return &engine.InvalidParamError{Param: "model", Reason: "model id is empty"}
	}
	if err := s.reserve(spec.ID); err != nil {
		return err
	}
	defer s.loading.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer context.AfterFunc(s.life, cancel)()
	defer cancel()
	m, err := s.load(ctx, spec)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil || s.closed {
		delete(s.models, spec.ID)
		if err == nil {
			m.close(ErrServerClosed)
			return ErrServerClosed
		}
		if s.closed {
			return fmt.Errorf("%w: load of %q cancelled: %w", ErrServerClosed, spec.ID, err)
		}
		return err
	}
	s.models[spec.ID] = m
	s.cfg.logger.Info("model loaded", "model", spec.ID, "engine", m.info.Engine,
		"context", m.info.ContextLength, "kv_capacity", m.info.KVCapacity, "max_batch", m.info.MaxBatch)
	return nil
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
	s.loading.Add(1)
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
	m := &model{info: em.Info(), engine: em, tok: tok}
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
	opts := append([]batcher.Option{batcher.WithLogger(s.cfg.logger), batcher.WithStepObserver(s.metrics.stepObserver(spec.ID))}, s.cfg.batcherOpts...)
	if m.batcher, err = batcher.New(em, m.queue, opts...); err != nil {
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
// with an error), and frees the model.
func (s *Server) UnloadModel(ctx context.Context, id string) error {
	s.mu.Lock()
	m, ok := s.models[id]
	if ok && m != nil {
		delete(s.models, id)
	}
	s.mu.Unlock()
	if !ok || m == nil {
		return &ModelNotFoundError{Model: id}
	}
	return m.shutdown(ctx)
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

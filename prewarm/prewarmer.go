package prewarm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// Target is what a PreWarmer loads and warms models into.
// mlxserving.Server implements it.
type Target interface {
	// Preload makes m known and loads it now, sharing a load of the same
	// model already under way.
	Preload(ctx context.Context, m Model) error
	// WarmModel runs the engine's warm-up (when its model implements
	// engine.Warmer) and one short real generation per prompt (one from
	// fixed token ids when there are none).
	WarmModel(ctx context.Context, id string, prompts []string) (WarmReport, error)
	// UnloadModel unloads the model, cancelling a load under way.
	UnloadModel(ctx context.Context, id string) error
}

// Registrar is implemented by targets that can know a model before loading
// it (mlxserving.Server does): Start registers every model first, so a
// request for one that is still pending loads it on demand instead of
// failing as unknown.
type Registrar interface {
	RegisterModel(m Model) error
}

// unloadTimeout bounds the unload of an aborted or failed model.
const unloadTimeout = 30 * time.Second

// PreWarmer loads and warms a list of models into a Target ahead of
// traffic: in priority order, one at a time or several at once, each
// within a timeout, a failure not stopping the others. Status reports
// each model's phase and timings; Ready waits for the readiness policy.
// Create it with New, run it with Start, end it with Stop.
type PreWarmer struct {
	target Target
	models []Model // in pre-warming order
	cfg    config

	mu       sync.Mutex
	progress []ModelProgress
	changed  chan struct{} // closed and replaced at every change
	started  bool
	cancel   context.CancelFunc
	done     chan struct{} // closed when every worker has ended
	wg       sync.WaitGroup
}

// New returns a PreWarmer for models, to run with Start. Models are
// ordered by Priority, highest first, keeping the given order among
// equals. Ids must be unique.
func New(target Target, models []Model, opts ...Option) (*PreWarmer, error) {
	if target == nil {
		return nil, errors.New("prewarm: target is nil")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o.applyPreWarmer(&cfg); err != nil {
			return nil, fmt.Errorf("prewarm: %w", err)
		}
	}
	seen := map[string]bool{}
	for _, m := range models {
		if err := m.validate(); err != nil {
			return nil, err
		}
		if seen[m.ID()] {
			return nil, &engine.InvalidParamError{Param: "model", Reason: fmt.Sprintf("model %q is listed twice", m.ID())}
		}
		seen[m.ID()] = true
	}
	sorted := slices.Clone(models)
	slices.SortStableFunc(sorted, func(a, b Model) int { return cmp.Compare(b.Priority, a.Priority) })
	p := &PreWarmer{target: target, models: sorted, cfg: cfg, changed: make(chan struct{}), done: make(chan struct{})}
	p.progress = make([]ModelProgress, len(sorted))
	for i, m := range sorted {
		p.progress[i] = ModelProgress{ID: m.ID(), Priority: m.Priority}
	}
	return p, nil
}

// Start begins pre-warming on goroutines of the PreWarmer's and returns at
// once. Cancelling ctx aborts like Stop. Start may be called once.
func (p *PreWarmer) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started {
		return errors.New("prewarm: already started")
	}
	p.started = true
	if r, ok := p.target.(Registrar); ok {
		for _, m := range p.models {
			if err := r.RegisterModel(m); err != nil {
				p.cfg.logger.Debug("prewarm: register", "model", m.ID(), "err", err)
			}
		}
	}
	ctx, p.cancel = context.WithCancel(ctx)
	next := make(chan int, len(p.models))
	for i := range p.models {
		next <- i
	}
	close(next)
	workers := min(p.cfg.concurrency, max(1, len(p.models)))
	p.wg.Add(workers)
	for range workers {
		go p.work(ctx, next)
	}
	go func() {
		p.wg.Wait()
		p.abortPending(context.Cause(ctx))
		close(p.done)
	}()
	return nil
}

// work pre-warms models from next until there are none or ctx ends.
func (p *PreWarmer) work(ctx context.Context, next <-chan int) {
	defer p.wg.Done()
	for i := range next {
		if ctx.Err() != nil {
			return
		}
		p.run(ctx, i)
	}
}

// run loads and warms one model.
func (p *PreWarmer) run(ctx context.Context, i int) {
	m := p.models[i]
	id := m.ID()
	mctx, cancel := context.WithTimeout(ctx, p.cfg.timeout)
	defer cancel()
	start := time.Now()
	p.update(i, func(st *ModelProgress) { st.Phase, st.Started = Loading, start })
	err := p.target.Preload(mctx, m)
	loaded := time.Now()
	if err == nil {
		p.update(i, func(st *ModelProgress) { st.Phase, st.LoadTime = Warming, loaded.Sub(start) })
		err = p.warm(mctx, i, m)
	}
	end := time.Now()
	if err == nil {
		p.update(i, func(st *ModelProgress) { st.Phase, st.WarmTime, st.Finished = Ready, end.Sub(loaded), end })
		return
	}
	phase := Failed
	if ctx.Err() != nil {
		phase, err = Aborted, context.Cause(ctx)
	}
	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), unloadTimeout)
	if uerr := p.target.UnloadModel(uctx, id); uerr != nil {
		p.cfg.logger.Warn("prewarm: unloading after failure", "model", id, "err", uerr)
	}
	ucancel()
	p.update(i, func(st *ModelProgress) {
		st.Phase, st.Err, st.Finished = phase, err, end
		if st.LoadTime == 0 {
			st.LoadTime = end.Sub(start)
		} else {
			st.WarmTime = end.Sub(loaded)
		}
	})
}

// warm runs the target's warm-up, again after a lost worker, waiting
// as the retry policy of WithWarmRetries says.
func (p *PreWarmer) warm(ctx context.Context, i int, m Model) error {
	t := p.cfg.warmRetry.Start()
	for attempt := 1; ; attempt++ {
		rep, err := p.target.WarmModel(ctx, m.ID(), m.Prompts)
		p.update(i, func(st *ModelProgress) { st.Attempts, st.Warm, st.Err = attempt, rep, err })
		if err == nil || ctx.Err() != nil {
			return err
		}
		p.cfg.logger.Warn("prewarm: warm-up failed", "model", m.ID(), "attempt", attempt, "err", err, "retryable", retry.Retryable(err))
		if werr := t.Wait(ctx, err); werr != nil {
			return err
		}
	}
}

// abortPending marks the models that never started as aborted by cause.
func (p *PreWarmer) abortPending(cause error) {
	if cause == nil {
		cause = ErrClosed
	}
	for i := range p.models {
		p.update(i, func(st *ModelProgress) {
			if st.Phase == Pending {
				st.Phase, st.Err = Aborted, cause
			}
		})
	}
}

// update changes model i's progress, wakes Ready waiters and calls the
// change callback when the phase moved.
func (p *PreWarmer) update(i int, f func(*ModelProgress)) {
	p.mu.Lock()
	before := p.progress[i].Phase
	f(&p.progress[i])
	st := p.progress[i]
	moved := st.Phase != before
	if moved {
		close(p.changed)
		p.changed = make(chan struct{})
	}
	p.mu.Unlock()
	if !moved {
		return
	}
	p.cfg.logger.Info("prewarm", "model", st.ID, "phase", st.Phase, "load", st.LoadTime, "warm", st.WarmTime, "err", st.Err)
	if p.cfg.onChange != nil {
		p.cfg.onChange(st)
	}
}

// Status returns a snapshot of every model's progress.
func (p *PreWarmer) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.statusLocked()
}

func (p *PreWarmer) statusLocked() Status {
	st := Status{Models: slices.Clone(p.progress)}
	for i := range st.Models {
		mp := &st.Models[i]
		mp.Warm.BatchSizes = slices.Clone(mp.Warm.BatchSizes)
		if mp.Phase.Settled() {
			st.Settled++
		}
	}
	st.Ready = p.readyLocked() == nil
	return st
}

// readyLocked returns nil when the policy is met, errPending while it may
// still be, and an error wrapping ErrNotReady when it no longer can be.
func (p *PreWarmer) readyLocked() error {
	var failed []error
	pending := false
	for _, mp := range p.progress {
		if !p.cfg.policy.covers(mp.Priority) {
			continue
		}
		switch mp.Phase {
		case Ready:
		case Failed, Aborted:
			failed = append(failed, fmt.Errorf("model %q %s: %w", mp.ID, mp.Phase, mp.Err))
		default:
			pending = true
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%w (%s): %w", ErrNotReady, p.cfg.policy, errors.Join(failed...))
	}
	if pending {
		return errPending
	}
	return nil
}

var errPending = errors.New("prewarm: models still warming")

// Ready waits until the readiness policy is met (nil), can no longer be
// met (an error wrapping ErrNotReady and the models' errors), or ctx ends.
func (p *PreWarmer) Ready(ctx context.Context) error {
	for {
		p.mu.Lock()
		err := p.readyLocked()
		ch := p.changed
		p.mu.Unlock()
		if !errors.Is(err, errPending) {
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// CheckReady reports, without waiting, whether the readiness policy is met:
// nil when it is, an error wrapping ErrNotReady otherwise (saying which
// models fail it, or that they are still warming). Its signature suits
// openai.WithReadyCheck.
func (p *PreWarmer) CheckReady(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.readyLocked()
	if errors.Is(err, errPending) {
		return fmt.Errorf("%w: models still loading or warming (%s)", ErrNotReady, p.cfg.policy)
	}
	return err
}

// Done is closed when every model has settled (after Start).
func (p *PreWarmer) Done() <-chan struct{} { return p.done }

// Wait waits until every model has settled and returns the failures
// joined, or ctx.Err().
func (p *PreWarmer) Wait(ctx context.Context) error {
	select {
	case <-p.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, mp := range p.progress {
		if mp.Phase == Failed || mp.Phase == Aborted {
			errs = append(errs, fmt.Errorf("model %q %s: %w", mp.ID, mp.Phase, mp.Err))
		}
	}
	return errors.Join(errs...)
}

// Stop aborts what is still pending, loading or warming — those models end
// Aborted with nothing of them loaded — and returns when the PreWarmer's
// goroutines have ended. Ready models stay loaded. Stop is idempotent and
// may be called without Start.
func (p *PreWarmer) Stop() {
	p.mu.Lock()
	first := !p.started
	p.started = true // a later Start fails
	cancel := p.cancel
	p.mu.Unlock()
	if first {
		p.abortPending(ErrClosed)
		close(p.done)
		return
	}
	if cancel != nil {
		cancel()
	}
	<-p.done
}

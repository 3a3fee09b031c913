package pyproc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// Engine runs models in a pool of supervised Python worker processes. It
// implements engine.Engine. Create it with New; the zero value is not
// usable.
type Engine struct {
	cfg        config
	runtimeDir string
	slots      []*slot
	closing    chan struct{}
	wg         sync.WaitGroup

	mu     sync.Mutex
	closed bool
	models map[*Model]struct{}
	nextID atomic.Uint64
}

var (
	_ engine.Engine         = (*Engine)(nil)
	_ engine.WorkerBreakers = (*Engine)(nil)
)

// slot is one position of the pool: the worker running there now, replaced
// by its supervisor when it dies.
type slot struct {
	idx      int
	restarts atomic.Int64
	mu       sync.Mutex
	cur      *proc         // nil while (re)starting
	up       chan struct{} // closed when cur is set or the slot is given up; replaced when cur dies
	gone     error         // set when the restart policy gave up
	open     atomic.Int64  // sequences routed here, for least-loaded routing
	breaker  *retry.Breaker
}

// current returns the live worker, waiting for a restart to finish if one
// is under way.
func (s *slot) current(ctx context.Context, closing chan struct{}) (*proc, error) {
	for {
		s.mu.Lock()
		p, up, gone := s.cur, s.up, s.gone
		s.mu.Unlock()
		if p != nil && p.alive() {
			return p, nil
		}
		if gone != nil {
			return nil, gone
		}
		select {
		case <-up:
		case <-closing:
			return nil, engine.ErrClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// New writes the embedded runtime to the cache directory, starts the
// workers and waits for their handshakes. A missing interpreter or backend
// gives an error wrapping engine.ErrUnavailable that says what to install.
func New(ctx context.Context, opts ...Option) (*Engine, error) {
	cfg := defaults()
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if err := cfg.placeGPUs(); err != nil {
		return nil, err
	}
	dir, err := installRuntime(cfg.cacheDir)
	if err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, runtimeDir: dir, closing: make(chan struct{}), models: map[*Model]struct{}{}}
	procs := make([]*proc, cfg.workers)
	errs := make([]error, cfg.workers)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			procs[i], errs[i] = startProc(ctx, &e.cfg, dir, i)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, p := range procs {
			if p != nil {
				p.fail("start-up failed")
				<-p.dead
			}
		}
		return nil, err
	}
	for i, p := range procs {
		br, err := retry.NewBreaker("worker-"+strconv.Itoa(i), cfg.breakerOpts...)
		if err != nil { // options were checked by WithBreaker
			return nil, err
		}
		s := &slot{idx: i, cur: p, up: make(chan struct{}), breaker: br}
		close(s.up)
		e.slots = append(e.slots, s)
		e.wg.Add(1)
		go e.supervise(s, p)
	}
	return e, nil
}

// Name returns "pyproc".
func (e *Engine) Name() string { return "pyproc" }

// Backend reports the backend the workers run ("torch" or "mlx") and their
// library versions, as the first worker's handshake gave them.
func (e *Engine) Backend() (string, map[string]any) {
	p, err := e.slots[0].current(context.Background(), e.closing)
	if err != nil {
		return "", nil
	}
	return p.hello.Backend, p.hello.Versions
}

// WorkerInfo describes one position of the worker pool.
type WorkerInfo struct {
	// Index is the worker's position in the pool.
	Index int
	// PID is the running process's id; 0 while it is being replaced.
	PID int
	// Restarts counts the processes started to replace lost ones.
	Restarts int
	// Sequences is the number of open sequences routed to this worker.
	Sequences int
	// Breaker is the state of the worker's circuit breaker.
	Breaker retry.State
}

// Workers describes the pool, one entry per worker.
func (e *Engine) Workers() []WorkerInfo {
	out := make([]WorkerInfo, len(e.slots))
	for i, s := range e.slots {
		s.mu.Lock()
		if s.cur != nil && s.cur.alive() {
			out[i].PID = s.cur.pid()
		}
		s.mu.Unlock()
		out[i].Index, out[i].Restarts, out[i].Sequences = i, int(s.restarts.Load()), int(s.open.Load())
		out[i].Breaker = s.breaker.State()
	}
	return out
}

// Breakers returns the state of each worker's circuit breaker, named
// "worker-<index>".
func (e *Engine) Breakers() []retry.Status {
	out := make([]retry.Status, len(e.slots))
	for i, s := range e.slots {
		out[i] = s.breaker.Status()
	}
	return out
}

// supervise watches the worker of one slot and replaces it, under the
// restart policy, whenever it dies, until the engine closes or the policy
// gives up.
func (e *Engine) supervise(s *slot, p *proc) {
	defer e.wg.Done()
	tries := e.cfg.restart.Start()
	for {
		started := time.Now()
		select {
		case <-p.dead:
		case <-e.closing:
			e.shutdown(p)
			return
		}
		s.mu.Lock()
		s.cur, s.up = nil, make(chan struct{})
		s.mu.Unlock()
		s.open.Store(0)
		e.cfg.logger.Warn("worker lost; restarting", "worker", s.idx, "reason", p.reason)
		if time.Since(started) > time.Minute {
			tries.Reset()
		}
		if p = e.restart(s, tries, p.lost()); p == nil {
			return
		}
	}
}

// restart starts a replacement worker and reloads every model on it, with
// its pinned adapters, waiting between attempts as the policy says. It
// returns nil when the engine closes first or the policy gives up.
func (e *Engine) restart(s *slot, tries *retry.Tracker, cause error) *proc {
	for {
		wait, ok := tries.Next(cause)
		if !ok {
			e.cfg.logger.Error("worker restart: giving up", "worker", s.idx, "attempts", tries.Attempts(), "err", cause)
			s.mu.Lock()
			s.gone = &LostError{Worker: s.idx, Reason: fmt.Sprintf("not restarted after %d attempts: %v", tries.Attempts(), cause)}
			close(s.up)
			s.mu.Unlock()
			return nil
		}
		select {
		case <-time.After(wait):
		case <-e.closing:
			return nil
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-e.closing:
				cancel()
			case <-ctx.Done():
			}
		}()
		p, err := startProc(ctx, &e.cfg, e.runtimeDir, s.idx)
		if err == nil {
			err = e.reload(ctx, p)
		}
		cancel()
		if err == nil {
			// Counted before the worker is published, so whoever sees it
			// serving also sees the restart that brought it.
			s.restarts.Add(1)
			s.mu.Lock()
			s.cur = p
			close(s.up)
			s.mu.Unlock()
			return p
		}
		e.cfg.logger.Error("worker restart failed", "worker", s.idx, "err", err)
		if p != nil {
			p.fail("restart failed")
			<-p.dead
		}
		cause = err
	}
}

// reload loads every open model onto a fresh worker, and each model's
// pinned adapters into its slots there (warmPinned), so that a pinned
// adapter never pays a load on its first request on the replacement.
func (e *Engine) reload(ctx context.Context, p *proc) error {
	e.mu.Lock()
	models := make([]*Model, 0, len(e.models))
	for m := range e.models {
		models = append(models, m)
	}
	e.mu.Unlock()
	for _, m := range models {
		if _, err := p.call(ctx, m.info.ID, m.loadRequest()); err != nil {
			return fmt.Errorf("reloading model %q: %w", m.info.ID, err)
		}
		if err := m.warmPinned(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// shutdownGrace is how long a worker that was asked to shut down (and
// whose stdin is closed) gets to exit before it is killed. A worker exits
// as soon as it has answered what was queued before the request.
const shutdownGrace = 2 * time.Second

// shutdown asks a worker to finish what it has queued and exit, closing its
// stdin, and kills it if it has not exited within shutdownGrace (or the
// start timeout, if shorter).
func (e *Engine) shutdown(p *proc) {
	if p.alive() {
		_, _, _ = p.send(request("shutdown", nil), false)
		_ = p.stdin.Close()
	}
	grace := min(shutdownGrace, e.cfg.startTimeout)
	select {
	case <-p.dead:
	case <-time.After(grace):
		p.fail(fmt.Sprintf("did not exit within %v of shutdown", grace))
		<-p.dead
	}
}

// Close unloads every model, stops the workers after they finish the work
// queued on them, and returns when the processes are gone. It is
// idempotent.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.models = map[*Model]struct{}{}
	e.mu.Unlock()
	close(e.closing)
	e.wg.Wait()
	return nil
}

func (e *Engine) isClosed() bool {
	select {
	case <-e.closing:
		return true
	default:
		return false
	}
}

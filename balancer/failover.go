package balancer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// startFunc sends the request to one backend. resume, when not empty,
// are the token ids an earlier backend delivered (api.Params.Resume).
type startFunc func(ctx context.Context, b Backend, resume []int32) (*api.Stream, error)

// serve places the request on a backend and returns a stream that fails
// over to another backend while no token has reached the caller, and
// after tokens resumes on another backend (see failoverSource.resumable).
func (lb *LoadBalancer) serve(ctx context.Context, r Route, start startFunc) (*api.Stream, error) {
	if lb.closed.Load() {
		return nil, ErrClosed
	}
	src := &failoverSource{lb: lb, route: r, start: start, tried: make(map[*member]bool), since: time.Now()}
	if r.Prefix != "" {
		src.hashes = chunkHashes(lb.seed, r.Prefix)
	}
	if err := src.open(ctx); err != nil {
		return nil, err
	}
	if lb.hist != nil {
		lb.hist.route.Record(ctx, time.Since(src.since).Seconds())
	}
	h := src.cur.Header()
	h.Backend = src.m.name
	return api.NewStream(ctx, src, h), nil
}

// failsOver reports whether err, met before any token reached the caller,
// sends the request on to another backend: the backend could not take or
// keep it (down, shutting down, full, lost its worker, lost the model),
// as opposed to the request being wrong or the caller gone: the caller's
// context, then retry.Classify.
func failsOver(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	return retry.Classify(err).FailsOver()
}

// backendFault reports whether err is the backend's failure, counted by its
// breaker: it lost the work (a lost worker, a refused or reset connection,
// a 5xx, a stall) or it is closed or cannot run. A backend that is merely
// busy (a full queue), lacks the model or refuses the request itself is
// not failing.
//
// A nested balancer that found no backend is failing only when its last
// backend's error was a fault (or it had none to try): a request its
// backends refused for reasons of its own says nothing against it.
func backendFault(err error) bool {
	var nb *NoBackendError
	if errors.As(err, &nb) {
		return nb.Last == nil || backendFault(nb.Last)
	}
	return retry.Classify(err).CountsAsFailure()
}

// failoverSource is the api.Source of a balanced request: the stream of
// the backend it runs on, replaced by another backend's if the first
// fails before a token reached the caller.
type failoverSource struct {
	lb     *LoadBalancer
	route  Route
	hashes []uint64
	start  startFunc
	since  time.Time // when the request came; routing looks at a snapshot at least this recent before it gives up

	mu        sync.Mutex
	cur       *api.Stream
	m         *member
	done      func(error) // reports the attempt's outcome to m's breaker
	tried     map[*member]bool
	closed    bool
	closeErr  error
	began     time.Time
	delivered int

	// Resuming after tokens (resumable): the token ids delivered, whether
	// a chunk reached the caller without its id (a foreign upstream),
	// the resumes so far, when the last token arrived, when the pending
	// resume broke off (zero once a token followed) and the gaps.
	tokens     []int32
	idsLost    bool
	resumes    int
	lastToken  time.Time
	resumeFrom time.Time
	resumeGap  time.Duration
}

// anyServes reports whether a member of the routing snapshot, draining or
// not, serves model, or there is no member at all (backends that are
// gone, not a model that is unknown).
func (lb *LoadBalancer) anyServes(model string) bool {
	members := lb.snap.Load().members
	if len(members) == 0 {
		return true
	}
	for _, v := range members {
		if v.load.Serves(model) {
			return true
		}
	}
	return false
}

// liveServes reports whether a backend of the routing snapshot that is
// not draining serves model.
func (lb *LoadBalancer) liveServes(model string) bool {
	for _, v := range lb.snap.Load().members {
		if !v.m.draining.Load() && !v.load.Draining && v.load.Serves(model) {
			return true
		}
	}
	return false
}

// open places the request on the next backend, trying others while they
// refuse it. It returns a *NoBackendError when none takes it.
func (s *failoverSource) open(ctx context.Context) error {
	var last error
	attempts := 0
	var waitBy time.Time // when waiting for a backend to be added ends
	for attempts < s.lb.cfg.maxAttempts {
		adds := s.lb.adds.Load() // before the pick: an Add after it ends a wait at once
		m, panicMode, home := s.lb.pick(ctx, s.route, s.hashes, s.tried, s.since)
		if m == nil {
			if len(s.tried) == 0 && !s.lb.anyServes(s.route.Model) {
				// Not a backend that is down: no backend has the model, as
				// a Server answers for a model it does not know.
				s.lb.stats.refused.Add(1)
				return fmt.Errorf("balancer: model %q not found on any backend: %w", s.route.Model, engine.ErrModelNotFound)
			}
			if s.lb.cfg.backendWait == 0 || s.lb.liveServes(s.route.Model) {
				break // refused by backends that are there: no wait
			}
			if waitBy.IsZero() {
				waitBy = time.Now().Add(s.lb.cfg.backendWait)
				s.lb.cfg.logger.Debug("no backend for the model; waiting for one", "model", s.route.Model, "wait", s.lb.cfg.backendWait)
			}
			if !s.lb.awaitBackend(ctx, adds, waitBy) {
				break
			}
			continue
		}
		s.tried[m] = true
		done := func(error) {}
		if !panicMode {
			d, err := m.breaker.Allow()
			if err != nil {
				last = err
				continue
			}
			done = d
		}
		attempts++
		m.inflight.Add(1)
		began := time.Now()
		st, err := s.start(ctx, m.backend, s.resumeTokens())
		if err != nil {
			m.inflight.Add(-1)
			done(err)
			if !failsOver(ctx, err) {
				return err
			}
			s.lb.cfg.logger.Debug("backend refused; failing over", "backend", m.name, "err", err)
			last = err
			s.lb.stats.failovers.Add(1)
			m.failovers.Add(1)
			continue
		}
		s.lb.routed(ctx, m, s.route, s.hashes, home)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			st.Close()
			m.inflight.Add(-1)
			done(nil)
			return s.closeErr
		}
		s.cur, s.m, s.done, s.began = st, m, done, began
		s.mu.Unlock()
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.lb.stats.refused.Add(1)
	if code := retry.Classify(last).Code; code == retry.CodeQueueFull || code == retry.CodeExceedsKVCapacity {
		// The last backend is up but full, or has too little KV room for
		// the request at all: the caller hears that (with its Retry-After)
		// as from a single Server (a 429 or a 400, not a 503).
		return last
	}
	return &NoBackendError{Model: s.route.Model, Tried: len(s.tried), RetryAfter: s.lb.retryAfter(last), Last: last}
}

// retryAfter is the wait a caller refused by every backend is told: the
// last backend's own Retry-After, or the breakers' open time.
func (lb *LoadBalancer) retryAfter(last error) time.Duration {
	if d, ok := retry.RetryAfter(last); ok {
		return d
	}
	return lb.cfg.refusedRetryAfter
}

// Recv returns the next chunk of the current backend's stream, failing
// over to another backend when it breaks before the first token.
func (s *failoverSource) Recv(ctx context.Context) (api.Chunk, error) {
	for {
		s.mu.Lock()
		cur := s.cur
		s.mu.Unlock()
		c, err := cur.Recv()
		if err == nil {
			return s.observe(c), nil
		}
		if errors.Is(err, io.EOF) {
			s.finish(nil)
			return api.Chunk{}, io.EOF
		}
		s.finish(err)
		s.mu.Lock()
		delivered, closed := s.delivered, s.closed
		s.mu.Unlock()
		if delivered == 0 && !closed && failsOver(ctx, err) {
			s.lb.stats.failovers.Add(1)
			s.m.failovers.Add(1)
			s.lb.cfg.logger.Warn("backend failed before the first token; failing over", "backend", s.m.name, "err", err)
			if oerr := s.open(ctx); oerr != nil {
				return api.Chunk{}, oerr
			}
			continue
		}
		if delivered > 0 && !closed && s.resumable(ctx, err) {
			from := s.m
			if oerr := s.open(ctx); oerr == nil {
				s.lb.stats.resumed.Add(1)
				from.resumes.Add(1)
				s.lb.cfg.logger.Warn("backend failed after tokens; resumed on another", "backend", from.name, "to", s.m.name, "delivered", delivered, "err", err)
				continue
			}
		}
		if delivered > 0 && ctx.Err() == nil && !closed {
			s.lb.stats.interrupted.Add(1)
			var ie *retry.InterruptedError
			if !errors.As(err, &ie) {
				err = &retry.InterruptedError{Delivered: delivered, Err: err}
			}
		}
		return api.Chunk{}, err
	}
}

// observe counts what reached the caller, times the first token, keeps
// the token ids for a resume, and on the final chunk adds the resumes to
// the usage and names the backend that finished the stream.
func (s *failoverSource) observe(c api.Chunk) api.Chunk {
	if c.Usage != nil {
		u := *c.Usage
		s.mu.Lock()
		u.Resumes += s.resumes
		u.ResumeGap += s.resumeGap
		u.Backend = s.m.name
		s.mu.Unlock()
		c.Usage = &u
	}
	if !c.HasToken && c.Text == "" {
		return c
	}
	now := time.Now()
	var gap time.Duration // a resume's, ended by this token
	s.mu.Lock()
	first := s.delivered == 0
	s.delivered++
	if c.HasToken {
		s.tokens = append(s.tokens, c.Token)
		if !s.resumeFrom.IsZero() {
			gap = now.Sub(s.resumeFrom)
			s.resumeGap += gap
			s.resumeFrom = time.Time{}
		}
		s.lastToken = now
	} else if c.Finish == "" {
		s.idsLost = true
	}
	m, began := s.m, s.began
	s.mu.Unlock()
	if first {
		m.observe(now.Sub(began), now)
	}
	if gap > 0 && s.lb.hist != nil {
		s.lb.hist.resumeGap.Record(context.Background(), gap.Seconds())
	}
	return c
}

// resumable reports whether a stream that broke off with err after tokens
// reached the caller goes on on another backend, and if so gets ready to:
// the backend failed (as failsOver judges the cause), every token that
// reached the caller came with its id (mlxserving backends; a foreign
// upstream's stream ends with the error) and the resumes are within the
// balancer's attempts. The next open then sends the request with those
// ids as api.Params.Resume.
func (s *failoverSource) resumable(ctx context.Context, err error) bool {
	cause := err
	var ie *retry.InterruptedError
	if errors.As(err, &ie) && ie.Err != nil {
		cause = ie.Err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.idsLost || len(s.tokens) == 0 || s.resumes >= s.lb.cfg.maxAttempts || !failsOver(ctx, cause) {
		return false
	}
	s.resumes++
	if s.resumeFrom.IsZero() {
		s.resumeFrom = s.lastToken
	}
	return true
}

// resumeTokens are the ids to resume from: nil before the first resume.
func (s *failoverSource) resumeTokens() []int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.resumes == 0 {
		return nil
	}
	return slices.Clone(s.tokens)
}

// finish ends the current attempt once: it leaves the backend's in-flight
// count and tells its breaker how it went.
func (s *failoverSource) finish(err error) {
	s.mu.Lock()
	done, m := s.done, s.m
	s.done = nil
	s.mu.Unlock()
	if done == nil {
		return
	}
	m.inflight.Add(-1)
	done(err)
}

// Close stops the current backend's stream.
func (s *failoverSource) Close(err error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed, s.closeErr = true, err
	cur := s.cur
	s.mu.Unlock()
	if cur != nil {
		cur.Close()
	}
	s.finish(nil)
}

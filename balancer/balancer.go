package balancer

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/retry"
)

// LoadBalancer routes requests across backends — local Servers, remote
// OpenAI-compatible instances, instances found over NATS — and is itself a
// [Backend], so balancers nest and a host program can swap a Server for a
// balancer without changing its code.
//
// Each request goes to a backend that serves its model, is healthy, is not
// draining and whose circuit breaker is closed, as the [Strategy] picks
// (default: [Weighted] with [DefaultWeights]: queue, KV use, prefix match
// and session home). A request refused before its first token — the
// backend is down, shutting down, full or has lost its worker — fails over
// to another backend. A backend that fails after tokens reached the
// caller is not asked again: the stream resumes on another backend, which
// gets the request with the delivered token ids as api.Params.Resume and
// streams only what follows, so the caller sees one generation (exact for
// greedy requests, and for seeded or penalised ones where the engines
// report engine.Info.Resumes); the final usage counts the resume
// (Usage.Resumes, ResumeGap) and names the backend that finished
// (Usage.Backend). Where the ids are unknown (a foreign OpenAI-compatible
// upstream) or no backend takes it, the stream ends with a
// *retry.InterruptedError. Backends that keep failing are ejected by their
// breaker (passive outlier detection); backends with a health check
// ([HealthChecker]) are also checked actively.
//
// Routing reads an immutable snapshot of the backends' load reports,
// rebuilt every [WithLoadRefresh] interval and when backends are added or
// removed, so a request calls no backend and waits on no shared lock; a
// session's home comes from a local copy of the affinity store's (see
// [WithAffinityRefresh]).
//
// A LoadBalancer is safe for concurrent use. Close stops its health checks
// and refreshes; the backends stay the caller's.
type LoadBalancer struct {
	cfg  config
	seed maphash.Seed

	mu      sync.RWMutex // guards members; never held on the request path
	members map[string]*member
	closed  atomic.Bool // written under mu

	refreshMu sync.Mutex // serialises snapshot rebuilds
	snap      atomic.Pointer[snapshot]

	addedMu sync.Mutex    // guards added; adds changes under it
	added   chan struct{} // closed, and replaced, when a backend is added (awaitBackend)
	adds    atomic.Uint64 // backends added so far: read without the lock on the request path
	homes   *homes        // nil without an affinity store

	stats      counters
	metricsReg metric.Registration // nil without a meter provider
	hist       *histograms         // nil without a meter provider
	stop       chan struct{}
	done       chan struct{}
}

// Balancer is the LoadBalancer's earlier name.
//
// Deprecated: use LoadBalancer.
type Balancer = LoadBalancer

// HealthChecker is a backend with an active health check, run every
// health-check interval (remote backends implement it; a local Server
// needs none).
type HealthChecker interface {
	CheckHealth(ctx context.Context) error
}

// member is one backend with the balancer's view of it.
type member struct {
	name     string
	backend  Backend
	breaker  *retry.Breaker
	prefix   *prefixIndex
	inflight atomic.Int64
	draining atomic.Bool
	healthy  atomic.Bool

	latMu  sync.Mutex
	ewma   float64 // peak-EWMA of time to first token, in ns
	latAt  time.Time
	routed atomic.Uint64
	// failovers and resumes count the requests that left this backend for
	// another: before their first token, and after tokens.
	failovers, resumes atomic.Uint64

	homeMu    sync.Mutex
	overSince int64 // unix ns since its pending went past the move bound; 0: not past it
}

type counters struct {
	routed, failovers, refused, interrupted, resumed atomic.Uint64
	home, spilled, moved                             atomic.Uint64 // sessions' requests: at home, spilled, moved
}

// New returns a balancer with no backends; add them with Add
// (or let discovery add them through the [Registry] interface).
func New(opts ...Option) (*LoadBalancer, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("balancer: %w", err)
		}
	}
	lb := &LoadBalancer{
		cfg: cfg, seed: maphash.MakeSeed(), members: make(map[string]*member),
		stop: make(chan struct{}), done: make(chan struct{}), added: make(chan struct{}),
	}
	lb.snap.Store(&snapshot{built: time.Now()})
	if cfg.affinity != nil {
		lb.homes = newHomes(cfg.affinity, cfg.affinityRefresh, cfg.affinityTimeout, cfg.logger)
	}
	if err := lb.registerMetrics(); err != nil {
		return nil, fmt.Errorf("balancer: metrics: %w", err)
	}
	go lb.loop()
	return lb, nil
}

var _ Backend = (*LoadBalancer)(nil)
var _ Registry = (*LoadBalancer)(nil)

// Add starts routing to b under name. Adding a name again replaces its
// backend (requests in flight on the old one finish).
func (lb *LoadBalancer) Add(name string, b Backend) error {
	if name == "" || b == nil {
		return errors.New("balancer: backend needs a name and a value")
	}
	br, err := retry.NewBreaker(name, lb.cfg.breakerOpts...)
	if err != nil {
		return fmt.Errorf("balancer: %w", err)
	}
	m := &member{name: name, backend: b, breaker: br, prefix: newPrefixIndex(lb.cfg.prefixChunks)}
	m.healthy.Store(true)
	lb.mu.Lock()
	if lb.closed.Load() {
		lb.mu.Unlock()
		return ErrClosed
	}
	lb.members[name] = m
	lb.mu.Unlock()
	if r, ok := b.(LoadReporter); ok {
		r.OnLoad(func(l Load) { lb.report(m, l) })
	}
	lb.refresh()
	lb.addedMu.Lock()
	lb.adds.Add(1)
	close(lb.added)
	lb.added = make(chan struct{})
	lb.addedMu.Unlock()
	lb.cfg.logger.Info("backend added", "backend", name)
	return nil
}

// awaitBackend waits until a backend is added after the adds-th, until
// by, or until ctx ends or the balancer closes; it reports whether one
// was added (its routing snapshot is already built).
func (lb *LoadBalancer) awaitBackend(ctx context.Context, adds uint64, by time.Time) bool {
	lb.addedMu.Lock()
	sig, now := lb.added, lb.adds.Load()
	lb.addedMu.Unlock()
	if now != adds {
		return true
	}
	d := time.Until(by)
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-sig:
		return true
	case <-t.C:
	case <-ctx.Done():
	case <-lb.stop:
	}
	return false
}

// Remove stops routing new requests to name; requests in flight finish.
func (lb *LoadBalancer) Remove(name string) {
	lb.mu.Lock()
	_, ok := lb.members[name]
	delete(lb.members, name)
	lb.mu.Unlock()
	if ok {
		lb.refresh()
		lb.cfg.logger.Info("backend removed", "backend", name)
	}
}

// Drain stops routing new requests to name, waits until its requests in
// flight have finished (or ctx ends), and removes it. It is how a backend
// is taken out for shutdown without failing anyone.
func (lb *LoadBalancer) Drain(ctx context.Context, name string) error {
	lb.mu.RLock()
	m, ok := lb.members[name]
	lb.mu.RUnlock()
	if !ok {
		return fmt.Errorf("balancer: no backend %q", name)
	}
	m.draining.Store(true)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for m.inflight.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	lb.Remove(name)
	return nil
}

// Close stops the health checks and refreshes and refuses new requests.
// Streams already returned go on. It is idempotent.
func (lb *LoadBalancer) Close() error {
	lb.mu.Lock()
	if lb.closed.Swap(true) {
		lb.mu.Unlock()
		return nil
	}
	lb.mu.Unlock()
	close(lb.stop)
	<-lb.done
	if lb.homes != nil {
		lb.homes.close()
	}
	if lb.metricsReg != nil {
		return lb.metricsReg.Unregister()
	}
	return nil
}

// Generate routes a completion request; see [LoadBalancer].
func (lb *LoadBalancer) Generate(ctx context.Context, req api.Request) (*api.Stream, error) {
	r := Route{Model: routedModel(req.Model, req.Adapter), Session: req.Session, Prefix: req.Prompt}
	return lb.serve(ctx, r, func(ctx context.Context, b Backend, resume []int32) (*api.Stream, error) {
		req := req
		req.Resume = append(slices.Clip(req.Resume), resume...)
		return b.Generate(ctx, req)
	})
}

// Chat routes a chat request; see [LoadBalancer].
func (lb *LoadBalancer) Chat(ctx context.Context, req api.ChatRequest) (*api.Stream, error) {
	r := Route{Model: routedModel(req.Model, req.Adapter), Session: req.Session, Prefix: chatPrefix(req.Messages)}
	return lb.serve(ctx, r, func(ctx context.Context, b Backend, resume []int32) (*api.Stream, error) {
		req := req
		req.Resume = append(slices.Clip(req.Resume), resume...)
		return b.Chat(ctx, req)
	})
}

// chatPrefix is the text prefix-aware routing matches for a conversation:
// its messages in order, so turns of one conversation and users behind one
// system prompt share leading chunks.
func chatPrefix(msgs []api.Message) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(m.Content)
		b.WriteByte('\n')
	}
	return b.String()
}

// Load sums the backends' reports as of the routing snapshot: the models
// any of them serves, their queues and running sequences, and their mean
// KV use. It calls no backend.
func (lb *LoadBalancer) Load() Load {
	var l Load
	n := 0
	for _, v := range lb.snap.Load().members {
		if v.m.draining.Load() {
			continue
		}
		bl := v.load
		for _, id := range bl.Models {
			if !slices.Contains(l.Models, id) {
				l.Models = append(l.Models, id)
			}
		}
		l.Waiting += bl.Waiting
		l.Running += bl.Running
		l.MaxBatch += bl.MaxBatch
		l.KVUsage += bl.KVUsage
		n++
	}
	if n > 0 {
		l.KVUsage /= float64(n)
	}
	slices.Sort(l.Models)
	return l
}

// pick chooses a backend for r among those not in tried, from the routing
// snapshot (refreshed once when it holds none and is older than since,
// the request's start). It returns nil when none serves the model. When
// every candidate is unhealthy or has an open breaker, it picks among
// them anyway (panic mode, as Envoy does): better a request on a doubtful
// backend than none at all.
//
// home is what the session's home meant for the request, which says
// whether the affinity store then names the chosen backend as the
// session's home (a new or moved home, or the home's entry refreshed); a
// request spilled off a busy home leaves it.
func (lb *LoadBalancer) pick(ctx context.Context, r Route, hashes []uint64, tried map[*member]bool, since time.Time) (m *member, panicMode bool, home homeDecision) {
	snap := lb.snap.Load()
	healthy, doubtful := snap.candidates(r, tried)
	if len(healthy)+len(doubtful) == 0 && snap.built.Before(since) {
		healthy, doubtful = lb.refreshSince(since).candidates(r, tried)
	}
	views := healthy
	if len(views) == 0 {
		views, panicMode = doubtful, true
	}
	if len(views) == 0 {
		return nil, false, noHome
	}
	pool := make([]*member, len(views))
	cands := make([]Candidate, len(views))
	for i, v := range views {
		pool[i] = v.m
		cands[i] = Candidate{
			Name: v.m.name, Load: v.load, InFlight: int(v.m.inflight.Load()),
			Latency: v.m.latency(), PrefixMatch: v.m.prefix.match(hashes),
		}
	}
	m, home = lb.sessionHome(ctx, r, pool, cands)
	if m != nil {
		return m, panicMode, home
	}
	i := lb.cfg.strategy.Pick(r, cands)
	if i < 0 || i >= len(pool) {
		i = 0
	}
	return pool[i], panicMode, home
}

// sessionHome returns the backend the shared affinity store assigns r's
// session to when the request should go there (see AffinityBounds), and
// what was decided.
func (lb *LoadBalancer) sessionHome(ctx context.Context, r Route, pool []*member, cands []Candidate) (*member, homeDecision) {
	if lb.homes == nil || r.Session == "" {
		return nil, noHome
	}
	name, err := lb.homes.get(ctx, affinityKey(r))
	if err != nil {
		lb.cfg.logger.Warn("affinity store unreachable; routing locally", "err", err)
		return nil, noHome
	}
	total := 0
	for _, c := range cands {
		total += c.Pending()
	}
	mean := float64(total) / float64(len(cands))
	for i, m := range pool {
		if m.name != name {
			continue
		}
		m.homeMu.Lock()
		d := lb.cfg.affinityBounds.judgeHome(cands[i].Pending(), mean, &m.overSince, time.Now())
		m.homeMu.Unlock()
		switch d {
		case atHome:
			lb.stats.home.Add(1)
			return m, d
		case spilled:
			lb.stats.spilled.Add(1)
		case moved:
			lb.stats.moved.Add(1)
		}
		return nil, d
	}
	return nil, newHome
}

func affinityKey(r Route) string { return r.Model + "\x00" + r.Session }

// routed records a request placed on m: its prefix, and its session's
// home as home decided (see homes.set).
func (lb *LoadBalancer) routed(ctx context.Context, m *member, r Route, hashes []uint64, home homeDecision) {
	m.routed.Add(1)
	lb.stats.routed.Add(1)
	m.prefix.add(hashes)
	if lb.homes != nil && r.Session != "" {
		lb.homes.set(ctx, affinityKey(r), m.name, home, lb.cfg.affinityTTL)
	}
}

// usable reports whether m is healthy and its breaker lets requests
// through.
func (m *member) usable() bool {
	return m.healthy.Load() && m.breaker.State() != retry.StateOpen
}

// latency returns m's peak-EWMA time to first token; zero before any was
// observed.
func (m *member) latency() time.Duration {
	m.latMu.Lock()
	defer m.latMu.Unlock()
	return time.Duration(m.ewma)
}

// observe folds a time to first token into m's peak EWMA: a sample above
// the average replaces it at once (peak), one below decays it with a 10 s
// time constant.
func (m *member) observe(ttft time.Duration, now time.Time) {
	const tau = float64(10 * time.Second)
	m.latMu.Lock()
	defer m.latMu.Unlock()
	v := float64(ttft)
	if m.latAt.IsZero() || v > m.ewma {
		m.ewma = v
	} else {
		w := 1 - math.Exp(-float64(now.Sub(m.latAt))/tau)
		m.ewma += w * (v - m.ewma)
	}
	m.latAt = now
}

// loop rebuilds the routing snapshot every refresh interval and runs the
// active health checks until Close.
func (lb *LoadBalancer) loop() {
	defer close(lb.done)
	refresh := time.NewTicker(lb.cfg.loadRefresh)
	defer refresh.Stop()
	var health <-chan time.Time // nil: no health checks
	if lb.cfg.healthInterval > 0 {
		t := time.NewTicker(lb.cfg.healthInterval)
		defer t.Stop()
		health = t.C
	}
	for {
		select {
		case <-lb.stop:
			return
		case <-refresh.C:
			lb.refresh()
		case <-health:
			lb.checkAll()
		}
	}
}

func (lb *LoadBalancer) checkAll() {
	lb.mu.RLock()
	ms := make([]*member, 0, len(lb.members))
	for _, m := range lb.members {
		ms = append(ms, m)
	}
	lb.mu.RUnlock()
	var wg sync.WaitGroup
	for _, m := range ms {
		hc, ok := m.backend.(HealthChecker)
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), lb.cfg.healthTimeout)
			defer cancel()
			err := hc.CheckHealth(ctx)
			if was := m.healthy.Swap(err == nil); was != (err == nil) {
				lb.cfg.logger.Warn("backend health changed", "backend", m.name, "healthy", err == nil, "err", err)
			}
		}()
	}
	wg.Wait()
}

// logger for options that take none.
func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// routedModel is the model a request is routed by: its LoRA adapter when
// it names one (instances list their adapters among their models, so the
// request goes to those that hold it), else its model.
func routedModel(model, adapter string) string {
	if adapter != "" {
		return adapter
	}
	return model
}

package natsbackend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/retry"
)

// Defaults.
const (
	// DefaultService is the micro service name instances register under
	// and discovery looks for unless WithService says otherwise.
	DefaultService = "mlxserving"
	// DefaultHeartbeat is how often a quiet stream sends a heartbeat
	// unless WithHeartbeat says otherwise; clients give up after three
	// missed ones.
	DefaultHeartbeat = time.Second
	// DefaultStallTimeout is how long an instance waits for a client to
	// renew its credit before it stops the generation (the client is gone
	// or stuck) unless WithStallTimeout says otherwise.
	DefaultStallTimeout = 30 * time.Second
)

var nameRe = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

type serveConfig struct {
	service   string
	heartbeat time.Duration
	stall     time.Duration
	logger    *slog.Logger
}

// WithStallTimeout sets how long a stream waits for credit before the
// generation is stopped. It must be positive; the default is
// DefaultStallTimeout.
func WithStallTimeout(d time.Duration) ServeOption {
	return serveOption(func(c *serveConfig) error {
		if d <= 0 {
			return fmt.Errorf("stall timeout %v: must be positive", d)
		}
		c.stall = d
		return nil
	})
}

// Service is a backend served over NATS. Stop ends it.
type Service struct {
	nc   *nats.Conn
	b    balancer.Backend
	name string
	cfg  serveConfig
	svc  micro.Service
	ctl  *nats.Subscription
	ctlP string // control subject prefix, "<service>.<id>.ctl."

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	streams  map[string]*serverStream
	next     uint64
	stopped  bool
	draining bool // Drain began: the load report says so

	// drop, set by tests only, loses chunk messages on the way: those it
	// returns true for are kept for a replay but not published.
	drop func(seq uint64, final bool) bool
}

// Serve exposes b on nc as an instance named name (letters, digits, '-'
// and '_'; unique among the service's instances): a micro service with
// endpoints generate, chat, embed and load, whose stats carry b's load
// report.
func Serve(nc *nats.Conn, name string, b balancer.Backend, opts ...ServeOption) (*Service, error) {
	if nc == nil || b == nil {
		return nil, errors.New("natsbackend: serve: connection and backend are required")
	}
	if !nameRe.MatchString(name) {
		return nil, fmt.Errorf("natsbackend: serve: instance name %q: want letters, digits, '-' or '_'", name)
	}
	cfg := serveConfig{service: DefaultService, heartbeat: DefaultHeartbeat, stall: DefaultStallTimeout,
		logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o.applyServe(&cfg); err != nil {
			return nil, fmt.Errorf("natsbackend: serve: %w", err)
		}
	}
	if err := checkNameFree(nc, cfg.service, name); err != nil {
		return nil, err
	}
	s := &Service{nc: nc, b: b, name: name, cfg: cfg, streams: make(map[string]*serverStream)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	svc, err := micro.AddService(nc, micro.Config{
		Name: cfg.service, Version: "1.0.0", Description: "mlxserving instance " + name,
		Metadata: map[string]string{"instance": name},
		StatsHandler: func(e *micro.Endpoint) any {
			if e.Name != "load" {
				return nil
			}
			return s.load()
		},
	})
	if err != nil {
		s.cancel()
		return nil, fmt.Errorf("natsbackend: serve: %w", err)
	}
	s.svc = svc
	prefix := cfg.service + "." + svc.Info().ID
	s.ctlP = prefix + ".ctl."
	g := svc.AddGroup(prefix, micro.WithGroupQueueGroupDisabled())
	err = errors.Join(
		g.AddEndpoint("generate", micro.HandlerFunc(func(r micro.Request) { s.handle(r, false) })),
		g.AddEndpoint("chat", micro.HandlerFunc(func(r micro.Request) { s.handle(r, true) })),
		g.AddEndpoint("embed", micro.HandlerFunc(s.handleEmbed)),
		g.AddEndpoint("load", micro.HandlerFunc(func(r micro.Request) { _ = r.RespondJSON(s.load()) })),
	)
	if err == nil {
		s.ctl, err = nc.Subscribe(s.ctlP+"*", s.control)
	}
	if err != nil {
		_ = svc.Stop()
		s.cancel()
		return nil, fmt.Errorf("natsbackend: serve: %w", err)
	}
	if nc.IsConnected() {
		// Once Serve returns, the instance answers: its subscriptions have
		// reached the server. (Disconnected, they are sent on reconnect.)
		_ = nc.FlushTimeout(2 * time.Second)
	}
	return s, nil
}

// nameCheckWait is how long Serve listens for live instances answering
// under its name before it registers.
const nameCheckWait = 250 * time.Millisecond

// checkNameFree asks every live instance of the service for its info
// ($SRV.INFO.<service>) and refuses a name one of them already has: two
// instances under one name would make discovery swap them, resetting
// their counters and breakers. A restarted instance's old incarnation no
// longer answers, so its name is free. Without a connection the check is
// skipped (discovery keeps the first of two in that case).
func checkNameFree(nc *nats.Conn, service, name string) error {
	if !nc.IsConnected() {
		return nil
	}
	inbox := nc.NewRespInbox()
	msgs := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(inbox, msgs)
	if err != nil {
		return fmt.Errorf("natsbackend: serve: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest("$SRV.INFO."+service, inbox, nil); err != nil {
		return fmt.Errorf("natsbackend: serve: %w", err)
	}
	deadline := time.After(nameCheckWait)
	for {
		select {
		case m := <-msgs:
			var info micro.Info
			if json.Unmarshal(m.Data, &info) == nil && info.Metadata["instance"] == name {
				return fmt.Errorf("%w: instance %q (id %s) of service %q answers under it", ErrNameTaken, name, info.ID, service)
			}
		case <-deadline:
			return nil
		}
	}
}

// ID returns the micro service instance id.
func (s *Service) ID() string { return s.svc.Info().ID }

// load is the backend's load report, marked while draining.
func (s *Service) load() balancer.Load {
	l := s.b.Load()
	s.mu.Lock()
	l.Draining = s.draining
	s.mu.Unlock()
	return l
}

// Drain stops the instance without losing work: it first advertises
// itself as draining (in the load report discovery reads every interval,
// so balancers stop routing to it) and keeps serving for notice, then
// leaves discovery and stops taking requests, and waits for the streams in
// flight to finish with their final chunk and usage. If ctx ends first,
// the streams left are ended as Stop ends them. A notice of two discovery
// intervals lets every balancer see the state. After Drain the Service is
// stopped.
func (s *Service) Drain(ctx context.Context, notice time.Duration) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.draining = true
	s.mu.Unlock()
	select {
	case <-time.After(notice):
	case <-ctx.Done():
	}
	s.mu.Lock()
	s.stopped = true // handle takes nothing new
	s.mu.Unlock()
	err := s.svc.Stop()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.cancel()
		<-done
	}
	_ = s.ctl.Unsubscribe()
	if s.nc.IsConnected() {
		_ = s.nc.FlushTimeout(2 * time.Second)
	}
	s.cancel()
	return err
}

// Stop stops answering discovery and requests, ends the streams in flight
// (their clients get an error) and waits for them. It is idempotent.
func (s *Service) Stop() error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	s.mu.Unlock()
	err := s.svc.Stop()
	_ = s.ctl.Unsubscribe()
	if s.nc.IsConnected() {
		// Once Stop returns the instance no longer answers: the
		// unsubscriptions have reached the server.
		_ = s.nc.FlushTimeout(2 * time.Second)
	}
	s.cancel()
	s.wg.Wait()
	return err
}

// handle starts a request in its own goroutine.
func (s *Service) handle(r micro.Request, chat bool) { s.spawn(func() { s.serve(r, chat) }) }

// spawn runs fn in a goroutine the service waits for when it stops, unless
// it has stopped: micro calls handlers one at a time per endpoint, so each
// request gets its own.
func (s *Service) spawn(fn func()) {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		fn()
	}()
}

func (s *Service) serve(r micro.Request, chat bool) {
	inbox := r.Headers().Get(hdrStream)
	window, _ := strconv.Atoi(r.Headers().Get(hdrWindow))
	if inbox == "" || window <= 0 {
		s.fail(r, fmt.Errorf("%w: request without %s or %s", ErrProtocol, hdrStream, hdrWindow))
		return
	}
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	st, err := s.start(ctx, r.Data(), chat)
	if err != nil {
		s.fail(r, err)
		return
	}
	defer st.Close()
	ss := newServerStream(cancel)
	id, untrack := s.track(ss)
	defer untrack()
	hb, _ := json.Marshal(st.Header())
	if err := r.Respond(hb, micro.WithHeaders(micro.Headers{hdrKind: {"start"}, hdrControl: {s.ctlP + id}})); err != nil {
		return
	}
	s.pump(ctx, st, ss, inbox, window)
}

// track registers ss under a new id, so the control subject of that id
// reaches it, until untrack.
func (s *Service) track(ss *serverStream) (id string, untrack func()) {
	s.mu.Lock()
	s.next++
	id = strconv.FormatUint(s.next, 36)
	s.streams[id] = ss
	s.mu.Unlock()
	return id, func() {
		s.mu.Lock()
		delete(s.streams, id)
		s.mu.Unlock()
	}
}

func (s *Service) start(ctx context.Context, data []byte, chat bool) (*api.Stream, error) {
	if chat {
		var req api.ChatRequest
		if err := json.Unmarshal(data, &req); err != nil {
			return nil, fmt.Errorf("%w: chat request: %v", ErrProtocol, err)
		}
		return s.b.Chat(ctx, req)
	}
	var req api.Request
	if err := json.Unmarshal(data, &req); err != nil {
		return nil, fmt.Errorf("%w: request: %v", ErrProtocol, err)
	}
	return s.b.Generate(ctx, req)
}

func (s *Service) fail(r micro.Request, err error) {
	w := toWire(err)
	if errors.Is(err, ErrProtocol) { // a request the instance cannot read
		w.Code = retry.CodeInvalidValue
	}
	b, _ := json.Marshal(w)
	_ = r.Respond(b, micro.WithHeaders(micro.Headers{hdrKind: {"error"}}))
}

// control receives credit, cancel, resend and done messages for the
// streams.
func (s *Service) control(m *nats.Msg) {
	id := m.Subject[len(s.ctlP):]
	s.mu.Lock()
	ss := s.streams[id]
	s.mu.Unlock()
	if ss == nil || len(m.Data) == 0 {
		return
	}
	switch m.Data[0] {
	case ctlCancel:
		ss.cancel()
	case ctlCredit:
		n, err := strconv.Atoi(string(m.Data[1:]))
		if err == nil && n > 0 {
			select {
			case ss.credit <- n:
			default: // a client flooding credit; the window is already open
			}
		}
	case ctlResend:
		if from, err := strconv.ParseUint(string(m.Data[1:]), 10, 64); err == nil {
			select {
			case ss.resend <- from:
			default: // the client asks again while it still misses some
			}
		}
	case ctlDone:
		select {
		case ss.done <- struct{}{}:
		default:
		}
	}
}

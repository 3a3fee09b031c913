package natsbackend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/mlxserving/mlxserving/balancer"
)

// Discovery defaults.
const (
	// DefaultInterval is how often discovery asks the instances for their
	// stats unless WithInterval says otherwise.
	DefaultInterval = time.Second
	// DefaultTimeout is how long an instance may stay silent before it is
	// removed unless WithTimeout says otherwise.
	DefaultTimeout = 3 * time.Second
	// DefaultCreditWindow is the credit, in chunks, a client grants a
	// stream unless WithCreditWindow says otherwise.
	DefaultCreditWindow = 256
	// DefaultStartTimeout bounds the wait for an instance to accept or
	// refuse a request unless WithStartTimeout says otherwise.
	DefaultStartTimeout = 10 * time.Second
	// DefaultProbeInterval is how often each known instance is probed
	// unless WithProbeInterval says otherwise: a dead instance's streams
	// resume elsewhere about this long after it died (one small
	// request-reply per instance and interval).
	DefaultProbeInterval = 50 * time.Millisecond
	// DefaultProbeTimeout is how long an instance may leave its probes
	// unanswered before it is taken for gone unless WithProbeTimeout says
	// otherwise: with the probe interval, what a stopped instance's
	// streams wait before they resume elsewhere (p99 404–466 ms after
	// SIGSTOP in examples/chaos, against 793–897 ms at 500 ms / 100 ms).
	// An instance busy serving answers a probe within milliseconds (its
	// NATS handler runs beside the engine); one taken for gone by mistake
	// costs only its streams' resumes, and it rejoins at its next answer.
	DefaultProbeTimeout = 200 * time.Millisecond
	// DefaultReconnectGrace is how long a request waits for a reconnecting
	// NATS connection unless WithReconnectGrace says otherwise.
	DefaultReconnectGrace = 500 * time.Millisecond
)

type discoverConfig struct {
	service  string
	interval time.Duration
	timeout  time.Duration
	probe    time.Duration
	// probeTimeout: an instance whose probes go unanswered this long is
	// gone (a stopped process, a machine cut off without closing its
	// connection).
	probeTimeout time.Duration
	client       clientConfig
	logger       *slog.Logger
}

func positive(what string, d time.Duration, dst *time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%s %v: must be positive", what, d)
	}
	*dst = d
	return nil
}

// WithInterval sets how often the instances are asked for their stats
// (which refreshes their load reports). Default DefaultInterval.
func WithInterval(d time.Duration) DiscoverOption {
	return discoverOption(func(c *discoverConfig) error { return positive("interval", d, &c.interval) })
}

// WithTimeout sets how long an instance may stay silent before it is
// removed from the registry; it must exceed the interval. Default
// DefaultTimeout.
func WithTimeout(d time.Duration) DiscoverOption {
	return discoverOption(func(c *discoverConfig) error { return positive("timeout", d, &c.timeout) })
}

// WithProbeInterval sets how often each known instance is probed: a
// request to its own load subject, which refreshes its load report, and
// which the NATS server answers "no responders" at once when the
// instance's connection is gone (a process killed, a machine whose kernel
// closed its sockets). Such an instance is removed, and its open streams
// end (a balancer fails them over, or resumes those that delivered
// tokens), within about one probe interval instead of the timeout. Default DefaultProbeInterval.
func WithProbeInterval(d time.Duration) DiscoverOption {
	return discoverOption(func(c *discoverConfig) error { return positive("probe interval", d, &c.probe) })
}

// WithProbeTimeout sets how long an instance may leave its probes
// unanswered before it is taken for gone: removed, its open streams ended
// (a balancer fails them over or resumes them) and told to stop. This is
// how an instance that stops without closing its connection (a stopped
// process, a machine cut off the network) is found within about this
// time rather than the discovery timeout; a live instance answers a probe
// in milliseconds. Should it answer again, its next stats answer adds it
// back. Default DefaultProbeTimeout.
func WithProbeTimeout(d time.Duration) DiscoverOption {
	return discoverOption(func(c *discoverConfig) error { return positive("probe timeout", d, &c.probeTimeout) })
}

// WithReconnectGrace sets how long a request waits for the NATS
// connection while it reconnects (a NATS server of a cluster went away
// and the client moves to another) before it fails with ErrNotConnected.
// 0 fails at once. Default DefaultReconnectGrace.
func WithReconnectGrace(d time.Duration) DiscoverOption {
	return discoverOption(func(c *discoverConfig) error {
		if d < 0 {
			return fmt.Errorf("reconnect grace %v: must be 0 or more", d)
		}
		c.client.reconnectGrace = d
		return nil
	})
}

// WithCreditWindow sets the credit, in chunks, clients grant each
// stream (how many chunks an instance may send ahead of the reader). It
// must be at least 2; default DefaultCreditWindow.
func WithCreditWindow(n int) DiscoverOption {
	return discoverOption(func(c *discoverConfig) error {
		if n < 2 {
			return fmt.Errorf("credit window %d: must be at least 2", n)
		}
		c.client.window = n
		return nil
	})
}

// WithStartTimeout bounds the wait for an instance to accept or refuse a
// request. Default DefaultStartTimeout.
func WithStartTimeout(d time.Duration) DiscoverOption {
	return discoverOption(func(c *discoverConfig) error { return positive("start timeout", d, &c.client.startTimeout) })
}

// Discovery keeps a registry in step with the instances on NATS. Close
// stops it.
type Discovery struct {
	nc  *nats.Conn
	reg balancer.Registry
	cfg discoverConfig
	sub *nats.Subscription
	// probes receives the answers to the probes, on probeP + micro id.
	probes *nats.Subscription
	probeP string

	mu        sync.Mutex
	instances map[string]*known // by micro id
	// replaced holds the ids that a newer instance under the same name
	// replaced (a restart); one of them answering again is a second live
	// instance under a taken name, ignored (see answer) until it is silent.
	replaced map[string]*replacedID
	lastAny  time.Time
	down     bool // NATS unreachable was logged; cleared when answers return

	stop chan struct{}
	done chan struct{}
}

type replacedID struct {
	seen   time.Time // when it last answered (or was replaced)
	warned bool
}

type known struct {
	name   string // the registry name
	client *Client
	seen   time.Time
	load   string // the instance's load subject, probed
	// unanswered is when the oldest probe it has not answered went out;
	// zero once it answered.
	unanswered time.Time
}

// Discover finds the instances of the service on nc, adds a Client per
// instance to reg under the instance's name, refreshes their load every
// interval and removes an instance silent for the timeout. It returns
// once the first query is sent; instances appear as they answer. ctx
// bounds the discovery's life as Close does.
func Discover(ctx context.Context, nc *nats.Conn, reg balancer.Registry, opts ...DiscoverOption) (*Discovery, error) {
	if nc == nil || reg == nil {
		return nil, errors.New("natsbackend: discover: connection and registry are required")
	}
	cfg := discoverConfig{service: DefaultService, interval: DefaultInterval, timeout: DefaultTimeout, probe: DefaultProbeInterval,
		probeTimeout: DefaultProbeTimeout,
		client: clientConfig{window: DefaultCreditWindow, heartbeat: DefaultHeartbeat, startTimeout: DefaultStartTimeout,
			reconnectGrace: DefaultReconnectGrace},
		logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o.applyDiscover(&cfg); err != nil {
			return nil, fmt.Errorf("natsbackend: discover: %w", err)
		}
	}
	if cfg.timeout <= cfg.interval {
		return nil, fmt.Errorf("natsbackend: discover: timeout %v must exceed the interval %v", cfg.timeout, cfg.interval)
	}
	d := &Discovery{nc: nc, reg: reg, cfg: cfg, instances: make(map[string]*known), lastAny: time.Now(),
		stop: make(chan struct{}), done: make(chan struct{})}
	inbox := nc.NewInbox()
	sub, err := nc.Subscribe(inbox, d.answer)
	if err != nil {
		return nil, fmt.Errorf("natsbackend: discover: %w", err)
	}
	d.sub = sub
	d.probeP = nc.NewInbox() + "."
	if d.probes, err = nc.Subscribe(d.probeP+"*", d.probeAnswer); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("natsbackend: discover: %w", err)
	}
	subject, _ := micro.ControlSubject(micro.StatsVerb, cfg.service, "")
	go d.loop(ctx, subject, inbox)
	return d, nil
}

// Close stops discovery and removes the instances it added.
func (d *Discovery) Close() error {
	select {
	case <-d.stop:
	default:
		close(d.stop)
	}
	<-d.done
	return nil
}

// Instances returns the names of the instances known now.
func (d *Discovery) Instances() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.instances))
	for _, k := range d.instances {
		out = append(out, k.name)
	}
	return out
}

func (d *Discovery) loop(ctx context.Context, subject, inbox string) {
	defer close(d.done)
	defer func() {
		_ = d.sub.Unsubscribe()
		_ = d.probes.Unsubscribe()
		d.mu.Lock()
		for id, k := range d.instances {
			d.reg.Remove(k.name)
			delete(d.instances, id)
		}
		d.mu.Unlock()
	}()
	tick := time.NewTicker(d.cfg.interval)
	defer tick.Stop()
	probe := time.NewTicker(d.cfg.probe)
	defer probe.Stop()
	d.query(subject, inbox)
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.stop:
			return
		case <-probe.C:
			d.probe()
		case <-tick.C:
			d.query(subject, inbox)
		}
	}
}

// query asks all instances for their stats and removes the silent ones.
func (d *Discovery) query(subject, inbox string) {
	if err := d.nc.PublishRequest(subject, inbox, nil); err != nil {
		d.cfg.logger.Debug("discovery: cannot query instances", "err", err)
	}
	d.expire()
}

// probe asks every known instance for its load on the instance's own
// subject. A live one answers (probeAnswer refreshes it); for one whose
// connection is gone the NATS server answers "no responders" at once; one
// that leaves its probes unanswered for the probe timeout is gone too.
func (d *Discovery) probe() {
	now := time.Now()
	d.mu.Lock()
	if d.nc.Status() != nats.CONNECTED {
		// A NATS outage says nothing of the instances (expire judges), and
		// the probes sent before it may be lost: count from the next.
		for _, k := range d.instances {
			k.unanswered = time.Time{}
		}
		d.mu.Unlock()
		return
	}
	subjects := make(map[string]string, len(d.instances))
	var silent []string
	for id, k := range d.instances {
		if k.load == "" {
			continue
		}
		if k.unanswered.IsZero() {
			k.unanswered = now
		} else if now.Sub(k.unanswered) > d.cfg.probeTimeout {
			silent = append(silent, id)
			continue
		}
		subjects[id] = k.load
	}
	d.mu.Unlock()
	for _, id := range silent {
		d.remove(id, "discovery: instance answers no probes; removed")
	}
	for id, subj := range subjects {
		_ = d.nc.PublishRequest(subj, d.probeP+id, nil)
	}
}

// probeAnswer handles the answer to one probe: a load report, or the NATS
// server's "no responders" status.
func (d *Discovery) probeAnswer(m *nats.Msg) {
	id := m.Subject[len(d.probeP):]
	if len(m.Data) == 0 && m.Header.Get("Status") == noResponders {
		d.forget(id)
		return
	}
	var load balancer.Load
	if err := json.Unmarshal(m.Data, &load); err != nil {
		return
	}
	load.Updated = time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if k, ok := d.instances[id]; ok {
		k.seen, k.unanswered = load.Updated, time.Time{}
		k.client.setLoad(load)
	}
}

// noResponders is the status of the NATS server's answer to a request
// nobody subscribes to.
const noResponders = "503"

// answer handles one instance's stats.
func (d *Discovery) answer(m *nats.Msg) {
	var st micro.Stats
	if err := json.Unmarshal(m.Data, &st); err != nil || st.ID == "" {
		d.cfg.logger.Warn("discovery: bad stats answer", "err", err)
		return
	}
	var gen, chat, embed, loadSubj string
	var load balancer.Load
	for _, e := range st.Endpoints {
		switch e.Name {
		case "generate":
			gen = e.Subject
		case "chat":
			chat = e.Subject
		case "embed": // absent on an instance of a version without embeddings
			embed = e.Subject
		case "load":
			loadSubj = e.Subject
			if len(e.Data) > 0 {
				_ = json.Unmarshal(e.Data, &load)
			}
		}
	}
	if gen == "" || chat == "" {
		return
	}
	load.Updated = time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-d.stop:
		return
	default:
	}
	d.lastAny = time.Now()
	if d.down {
		d.down = false
		d.cfg.logger.Info("discovery: NATS reachable again")
	}
	if k, ok := d.instances[st.ID]; ok {
		k.seen, k.unanswered = time.Now(), time.Time{}
		k.client.setLoad(load)
		return
	}
	name := st.Metadata["instance"]
	if name == "" {
		name = st.ID
	}
	if r, ok := d.replaced[st.ID]; ok {
		// Replaced by a newer instance under its name, and still alive:
		// two instances share a name. Keep the newer; say so once.
		r.seen = time.Now()
		if !r.warned {
			r.warned = true
			d.cfg.logger.Warn("discovery: two live instances under one name; routing to the newer only", "instance", name, "ignored_id", st.ID)
		}
		return
	}
	for id, k := range d.instances {
		if k.name == name {
			// A new instance under a known name: the instance restarted
			// (Serve refuses a name a live instance has). The new one
			// replaces it in the registry.
			delete(d.instances, id)
			k.client.markLost()
			if d.replaced == nil {
				d.replaced = map[string]*replacedID{}
			}
			d.replaced[id] = &replacedID{seen: time.Now()}
			d.cfg.logger.Info("discovery: instance restarted", "instance", name, "old_id", id, "id", st.ID)
			break
		}
	}
	c := &Client{nc: d.nc, instance: name, id: st.ID, generate: gen, chat: chat, embed: embed, cfg: d.cfg.client, gone: d.forget,
		lost: make(chan struct{})}
	c.setLoad(load)
	if err := d.reg.Add(name, c); err != nil {
		d.cfg.logger.Warn("discovery: registry refused instance", "instance", name, "err", err)
		return
	}
	d.instances[st.ID] = &known{name: name, client: c, seen: time.Now(), load: loadSubj}
	d.cfg.logger.Info("discovery: instance found", "instance", name, "id", st.ID, "models", load.Models)
}

// forget removes the instance with micro id at once: a request or probe
// to it found no responders (its process died, or it left), so waiting for
// the discovery timeout would only send more requests to nobody, and its
// open streams end at once (see Client). Should it be alive
// after all (its connection moving to another server of a NATS cluster),
// its next stats answer adds it again.
func (d *Discovery) forget(id string) {
	d.remove(id, "discovery: instance has no responders; removed")
}

// remove removes the instance with micro id at once, ending its streams,
// and logs why.
func (d *Discovery) remove(id, why string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k, ok := d.instances[id]
	if !ok {
		return
	}
	delete(d.instances, id)
	d.reg.Remove(k.name)
	k.client.markLost()
	d.cfg.logger.Warn(why, "instance", k.name, "id", id)
}

// expire removes instances silent for the timeout.
func (d *Discovery) expire() {
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.down && now.Sub(d.lastAny) > d.cfg.timeout && d.nc.Status() != nats.CONNECTED {
		d.down = true
		d.cfg.logger.Warn("discovery: NATS unreachable; dropping its instances, routing to the rest", "status", d.nc.Status().String())
	}
	for id, r := range d.replaced {
		if now.Sub(r.seen) > d.cfg.timeout {
			delete(d.replaced, id)
		}
	}
	for id, k := range d.instances {
		if now.Sub(k.seen) > d.cfg.timeout {
			d.reg.Remove(k.name)
			delete(d.instances, id)
			k.client.markLost()
			d.cfg.logger.Warn("discovery: instance stopped answering; removed", "instance", k.name, "silent", now.Sub(k.seen).Round(time.Millisecond))
		}
	}
}

// Client returns the Client of the instance registered as name, nil when
// none is known.
func (d *Discovery) Client(name string) *Client {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, k := range d.instances {
		if k.name == name {
			return k.client
		}
	}
	return nil
}

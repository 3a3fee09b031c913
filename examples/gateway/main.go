package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"

	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/balancer/httpbackend"
	"github.com/mlxserving/mlxserving/balancer/natsbackend"
	"github.com/mlxserving/mlxserving/balancer/redisaffinity"
	"github.com/mlxserving/mlxserving/openai"
)

// natsPasswordEnv holds the password for -nats-user (kept out of argv).
const natsPasswordEnv = "MLXSERVING_NATS_PASSWORD"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

type options struct {
	addr, natsURLs, upstreams, strategy, redisAddr, apiKeys string
	redisPrefix                                             string
	upstreamResume                                          bool
	bounds                                                  balancer.AffinityBounds
	cred                                                    natsbackend.Credentials
	drain                                                   time.Duration
	// Discovery over NATS: how often instances are asked for their stats
	// and probed, how long one may stay silent, and the instances'
	// heartbeat.
	interval, timeout, probe, heartbeat time.Duration
	// probeTimeout: an instance that leaves its probes unanswered this
	// long is dropped.
	probeTimeout time.Duration
	// grace is how long a request waits for a reconnecting NATS
	// connection; past it requests are refused at once (503).
	grace   time.Duration
	verbose bool
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "address to listen on")
	fs.StringVar(&o.natsURLs, "nats", "", "find instances over NATS: server URLs, comma-separated")
	fs.StringVar(&o.cred.CredsFile, "nats-creds", "", "NATS credentials file (JWT + NKey)")
	fs.StringVar(&o.cred.NKeySeedFile, "nats-nkey", "", "file holding an NKey seed")
	fs.StringVar(&o.cred.User, "nats-user", "", "NATS user; the password comes from $"+natsPasswordEnv)
	fs.StringVar(&o.cred.CAFile, "nats-ca", "", "CA certificate file for the NATS server's TLS")
	fs.StringVar(&o.cred.CertFile, "nats-cert", "", "client certificate file (TLS), with -nats-key")
	fs.StringVar(&o.cred.KeyFile, "nats-key", "", "client key file (TLS), with -nats-cert")
	fs.DurationVar(&o.interval, "discovery-interval", natsbackend.DefaultInterval, "with -nats: how often the instances are asked for their stats")
	fs.DurationVar(&o.timeout, "discovery-timeout", natsbackend.DefaultTimeout, "with -nats: how long an instance may stay silent before it is dropped")
	fs.DurationVar(&o.probe, "probe-interval", natsbackend.DefaultProbeInterval,
		"with -nats: how often each instance is probed (a dead one is dropped, and its requests fail over, within about this)")
	fs.DurationVar(&o.probeTimeout, "probe-timeout", natsbackend.DefaultProbeTimeout,
		"with -nats: an instance that answers no probe for this long (stopped, or cut off without closing its connection) is dropped and its streams go on elsewhere")
	fs.DurationVar(&o.heartbeat, "nats-heartbeat", natsbackend.DefaultHeartbeat,
		"with -nats: the instances' -nats-heartbeat; a stream silent for three of them has lost its instance")
	fs.DurationVar(&o.grace, "nats-reconnect-grace", natsbackend.DefaultReconnectGrace,
		"with -nats: how long a request waits for the NATS connection while it reconnects; once it has been down longer, requests are refused at once (503, Retry-After) unless -upstream servers can take them")
	fs.StringVar(&o.upstreams, "upstream", "", "OpenAI-compatible servers to route to as well, comma-separated base URLs")
	fs.StringVar(&o.strategy, "strategy", "weighted", "round-robin, least-loaded, peak-ewma, p2c, session or weighted")
	fs.StringVar(&o.redisAddr, "redis", "", "Redis address: session homes shared by gateway replicas")
	fs.StringVar(&o.redisPrefix, "redis-prefix", redisaffinity.DefaultPrefix,
		"with -redis: the prefix of every key, so several clusters share one Redis (their gateways each with its own)")
	fs.BoolVar(&o.upstreamResume, "upstream-resume", false, "the -upstream servers are mlxserving: a stream cut after tokens resumes on another backend (token ids travel)")
	fs.IntVar(&o.bounds.SpillPending, "affinity-spill", balancer.DefaultAffinityBounds.SpillPending,
		"a session's request goes elsewhere once (its home kept) when the home holds more pending requests than this and 1.5x the mean")
	fs.IntVar(&o.bounds.MovePending, "affinity-move", balancer.DefaultAffinityBounds.MovePending,
		"a session moves when its home stays past this many pending requests and 2x the mean for -affinity-move-after")
	fs.DurationVar(&o.bounds.MoveAfter, "affinity-move-after", balancer.DefaultAffinityBounds.MoveAfter, "see -affinity-move")
	fs.StringVar(&o.apiKeys, "api-keys", "", "JSON file of API keys (see openai.LoadKeyFile); default: no keys")
	fs.BoolVar(&o.verbose, "v", false, "debug logging (every request sent on to another backend)")
	fs.DurationVar(&o.drain, "drain", 30*time.Second, "how long shutdown waits for requests in flight")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.natsURLs == "" && o.upstreams == "" {
		return o, errors.New("no backends: give -nats, -upstream or both")
	}
	if _, err := strategy(o.strategy); err != nil {
		return o, err
	}
	if o.redisAddr != "" && o.redisPrefix == "" {
		return o, errors.New("-redis-prefix is empty")
	}
	if o.grace < 0 {
		return o, fmt.Errorf("-nats-reconnect-grace %v: want 0 or more", o.grace)
	}
	if o.interval <= 0 || o.probe <= 0 || o.probeTimeout <= 0 || o.heartbeat <= 0 || o.timeout <= o.interval {
		return o, fmt.Errorf("-discovery-interval %v, -probe-interval %v, -probe-timeout %v, -nats-heartbeat %v: want positive durations; -discovery-timeout %v: want more than the interval",
			o.interval, o.probe, o.probeTimeout, o.heartbeat, o.timeout)
	}
	return o, nil
}

func strategy(name string) (balancer.Strategy, error) {
	switch name {
	case "round-robin":
		return balancer.RoundRobin(), nil
	case "least-loaded":
		return balancer.LeastLoaded(), nil
	case "peak-ewma":
		return balancer.PeakEWMA(), nil
	case "p2c":
		return balancer.PowerOfTwo(balancer.LeastLoaded()), nil
	case "session":
		return balancer.SessionAffinity(1.25, balancer.LeastLoaded()), nil
	case "weighted":
		return balancer.Weighted(balancer.DefaultWeights), nil
	}
	return nil, fmt.Errorf("-strategy %q: want round-robin, least-loaded, peak-ewma, p2c, session or weighted", name)
}

// run serves until ctx ends. If listening is not nil it receives the
// address once the gateway accepts connections.
func run(ctx context.Context, args []string, logOut io.Writer, listening chan<- string) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if o.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: level}))
	mp, metricsHandler, err := newMetrics()
	if err != nil {
		return err
	}
	defer func() { _ = mp.Shutdown(context.Background()) }()
	gw, err := newGateway(ctx, o, log, mp)
	if err != nil {
		return err
	}
	defer gw.close()
	hopts := []openai.Option{openai.WithLogger(log), openai.WithMeterProvider(mp), openai.WithMetricsHandler(metricsHandler)}
	var keys []openai.Key
	if o.apiKeys != "" {
		if keys, err = openai.LoadKeyFile(o.apiKeys); err != nil {
			return err
		}
		hopts = append(hopts, openai.WithAPIKeys(keys...))
	}
	h, err := openai.New(gw.backend(o), hopts...)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle(statsPath, adminOnly(keys, statsHandler(gw.lb, gw.nc, gw.instances)))
	mux.Handle("/", h)
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	log.Info("gateway listening", "addr", ln.Addr().String(), "strategy", o.strategy)
	if listening != nil {
		listening <- ln.Addr().String()
	}
	select {
	case <-ctx.Done():
	case err := <-served:
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), o.drain)
	defer cancel()
	err = hs.Shutdown(sctx)
	<-served
	return err
}

// gateway is the load balancer over the -upstream servers and the
// instances Discover finds, with what it needs closed.
type gateway struct {
	lb      *balancer.LoadBalancer
	nc      *nats.Conn             // nil without -nats
	disc    *natsbackend.Discovery // nil without -nats
	state   *natsState             // nil without -nats
	closers []func()
}

// close stops discovery and closes the rest, last opened first.
func (g *gateway) close() {
	for i := len(g.closers) - 1; i >= 0; i-- {
		g.closers[i]()
	}
}

// backend is what the OpenAI handler serves: the balancer, behind a
// natsGuard when NATS is the only way to instances.
func (g *gateway) backend(o options) balancer.Backend {
	if g.nc == nil || o.upstreams != "" {
		return g.lb
	}
	return &natsGuard{LoadBalancer: g.lb, nc: g.nc, state: g.state, grace: o.grace}
}

// instances names the instances discovery knows now.
func (g *gateway) instances() []string {
	if g.disc == nil {
		return nil
	}
	return g.disc.Instances()
}

// newGateway builds the load balancer, its metrics exported through mp.
func newGateway(ctx context.Context, o options, log *slog.Logger, mp metric.MeterProvider) (*gateway, error) {
	g := &gateway{}
	gw, err := g.build(ctx, o, log, mp)
	if err != nil {
		g.close()
	}
	return gw, err
}

func (g *gateway) build(ctx context.Context, o options, log *slog.Logger, mp metric.MeterProvider) (*gateway, error) {
	strat, _ := strategy(o.strategy)
	lbOpts := []balancer.Option{balancer.WithStrategy(strat), balancer.WithLogger(log), balancer.WithMeterProvider(mp)}
	if o.redisAddr != "" {
		rdb := redis.NewClient(&redis.Options{Addr: o.redisAddr})
		g.closers = append(g.closers, func() { _ = rdb.Close() })
		store, err := redisaffinity.New(rdb, redisaffinity.WithPrefix(o.redisPrefix))
		if err != nil {
			return nil, err
		}
		lbOpts = append(lbOpts, balancer.WithAffinityStore(store, 0), balancer.WithAffinityBounds(o.bounds))
	}
	lb, err := balancer.New(lbOpts...)
	if err != nil {
		return nil, err
	}
	g.lb = lb
	g.closers = append(g.closers, func() { _ = lb.Close() })
	for i, u := range strings.Split(o.upstreams, ",") {
		if u = strings.TrimSpace(u); u == "" {
			continue
		}
		var hopts []httpbackend.Option
		if o.upstreamResume {
			hopts = append(hopts, httpbackend.WithResume())
		}
		b, err := httpbackend.New(u, hopts...)
		if err == nil {
			g.closers = append(g.closers, func() { _ = b.Close() })
			err = lb.Add(fmt.Sprintf("upstream-%d", i), b)
		}
		if err != nil {
			return nil, fmt.Errorf("-upstream %s: %w", u, err)
		}
	}
	if o.natsURLs != "" {
		o.cred.Password = os.Getenv(natsPasswordEnv)
		nopts, err := o.cred.Options()
		if err != nil {
			return nil, err
		}
		g.state = &natsState{}
		nopts = append(nopts, g.state.options()...)
		nc, err := nats.Connect(o.natsURLs, append(nopts, nats.Name("mlxserving gateway"), nats.MaxReconnects(-1))...)
		if err != nil {
			return nil, fmt.Errorf("-nats %s: %w", o.natsURLs, err)
		}
		g.closers = append(g.closers, nc.Close)
		d, err := natsbackend.Discover(ctx, nc, lb, natsbackend.WithLogger(log), natsbackend.WithInterval(o.interval),
			natsbackend.WithTimeout(o.timeout), natsbackend.WithProbeInterval(o.probe), natsbackend.WithProbeTimeout(o.probeTimeout), natsbackend.WithHeartbeat(o.heartbeat),
			natsbackend.WithReconnectGrace(o.grace))
		if err != nil {
			return nil, err
		}
		g.closers = append(g.closers, func() { _ = d.Close() })
		g.nc, g.disc = nc, d
		reg, err := registerNATSMetrics(mp, nc, g.instances)
		if err != nil {
			return nil, err
		}
		g.closers = append(g.closers, func() { _ = reg.Unregister() })
	}
	return g, nil
}

package balancer

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// WithMeterProvider exports the balancer's state as OpenTelemetry
// instruments. Read from Stats when the provider collects: mlxserving.lb.requests
// by result (routed, failover, refused, interrupted, resumed),
// mlxserving.lb.affinity by decision (home, spilled, moved), and per
// backend mlxserving.lb.backend.requests by result (routed; failover and
// resumed: requests that left it for another backend), mlxserving.lb.backend.in_flight,
// mlxserving.lb.backend.healthy (1 or 0), mlxserving.lb.backend.draining
// (1 or 0), mlxserving.lb.backend.ttft (its peak-EWMA time to first
// token, seconds) and mlxserving.breaker.state (0 closed, 1 half-open, 2
// open, as the Server reports its workers'). Recorded as requests go:
// the histograms mlxserving.lb.route.duration (from a request's arrival
// until a backend took it, failovers included, seconds) and
// mlxserving.lb.resume.gap (what each resume added to a stream, from the
// last token before its backend failed to the first after, seconds). The
// default exports nothing.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error {
		if mp == nil {
			return errors.New("meter provider is nil")
		}
		c.meterProvider = mp
		return nil
	}
}

// registerMetrics registers lb's instruments with the configured provider;
// Close unregisters them.
func (lb *LoadBalancer) registerMetrics() error {
	if lb.cfg.meterProvider == nil {
		return nil
	}
	meter := lb.cfg.meterProvider.Meter("github.com/mlxserving/mlxserving/balancer")
	requests, err1 := meter.Int64ObservableCounter("mlxserving.lb.requests",
		metric.WithDescription("Balanced requests by result: routed to a backend, failed over before the first token, refused by every backend, interrupted after tokens, resumed on another backend after tokens."))
	inflight, err2 := meter.Int64ObservableGauge("mlxserving.lb.backend.in_flight", metric.WithDescription("Requests the balancer has open on each backend."))
	healthy, err3 := meter.Int64ObservableGauge("mlxserving.lb.backend.healthy", metric.WithDescription("1 when a backend's last active health check passed, else 0."))
	ttft, err4 := meter.Float64ObservableGauge("mlxserving.lb.backend.ttft", metric.WithUnit("s"),
		metric.WithDescription("Peak-EWMA time to first token per backend."))
	breaker, err5 := meter.Int64ObservableGauge("mlxserving.breaker.state",
		metric.WithDescription("Circuit breaker state per backend: 0 closed, 1 half-open, 2 open."))
	affinity, err6 := meter.Int64ObservableCounter("mlxserving.lb.affinity",
		metric.WithDescription("Requests of sessions with a home backend by decision: sent home, spilled elsewhere once (the home kept), moved the home."))
	perBackend, err7 := meter.Int64ObservableCounter("mlxserving.lb.backend.requests",
		metric.WithDescription("Requests per backend by result: routed to it, failed over from it before the first token, resumed from it on another backend after tokens."))
	draining, err8 := meter.Int64ObservableGauge("mlxserving.lb.backend.draining", metric.WithDescription("1 while a backend drains (routed nothing new), else 0."))
	if err := errors.Join(err1, err2, err3, err4, err5, err6, err7, err8); err != nil {
		return err
	}
	hist, err := newHistograms(meter)
	if err != nil {
		return err
	}
	result := func(r string) metric.ObserveOption { return metric.WithAttributes(attribute.String("result", r)) }
	reg, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := lb.Stats()
		o.ObserveInt64(requests, int64(st.Routed), result("routed"))
		o.ObserveInt64(requests, int64(st.Failovers), result("failover"))
		o.ObserveInt64(requests, int64(st.Refused), result("refused"))
		o.ObserveInt64(requests, int64(st.Interrupted), result("interrupted"))
		o.ObserveInt64(requests, int64(st.Resumed), result("resumed"))
		decision := func(d string) metric.ObserveOption { return metric.WithAttributes(attribute.String("decision", d)) }
		o.ObserveInt64(affinity, int64(st.AffinityHome), decision("home"))
		o.ObserveInt64(affinity, int64(st.AffinitySpilled), decision("spilled"))
		o.ObserveInt64(affinity, int64(st.AffinityMoved), decision("moved"))
		for _, b := range st.Backends {
			attrs := metric.WithAttributes(attribute.String("backend", b.Name))
			o.ObserveInt64(inflight, int64(b.InFlight), attrs)
			o.ObserveInt64(healthy, one(b.Healthy), attrs)
			o.ObserveInt64(draining, one(b.Draining || b.Load.Draining), attrs)
			for r, n := range map[string]uint64{"routed": b.Routed, "failover": b.Failovers, "resumed": b.Resumes} {
				o.ObserveInt64(perBackend, int64(n), metric.WithAttributes(attribute.String("backend", b.Name), attribute.String("result", r)))
			}
			o.ObserveFloat64(ttft, b.Latency.Seconds(), attrs)
			o.ObserveInt64(breaker, int64(b.Breaker.State), metric.WithAttributes(attribute.String("breaker", b.Name)))
		}
		return nil
	}, requests, inflight, healthy, ttft, breaker, affinity, perBackend, draining)
	lb.metricsReg, lb.hist = reg, hist
	return err
}

// one is 1 for true, 0 for false.
func one(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// histograms are the instruments recorded as requests go.
type histograms struct {
	route, resumeGap metric.Float64Histogram
}

func newHistograms(meter metric.Meter) (*histograms, error) {
	route, err1 := meter.Float64Histogram("mlxserving.lb.route.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from a request's arrival at the balancer until a backend took it, failovers included."),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
	gap, err2 := meter.Float64Histogram("mlxserving.lb.resume.gap", metric.WithUnit("s"),
		metric.WithDescription("Time a resume on another backend added to a stream, from the last token before its backend failed to the first after."),
		metric.WithExplicitBucketBoundaries(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return &histograms{route: route, resumeGap: gap}, nil
}

package prewarm

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// managerMetrics holds a Manager's instruments.
type managerMetrics struct {
	loads        metric.Int64Counter
	loadSeconds  metric.Float64Histogram
	evictions    metric.Int64Counter
	loaded       metric.Int64UpDownCounter
	registration metric.Registration
}

func newManagerMetrics(mp metric.MeterProvider, g *Manager) (*managerMetrics, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	meter := mp.Meter("github.com/mlxserving/mlxserving/prewarm")
	m := &managerMetrics{}
	var err1, err2, err3, err4, err5, err6 error
	m.loads, err1 = meter.Int64Counter("mlxserving.model.loads", metric.WithDescription("Model loads by model and outcome."), metric.WithUnit("{load}"))
	m.loadSeconds, err2 = meter.Float64Histogram("mlxserving.model.load.duration", metric.WithDescription("Time one model load took."),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300))
	m.evictions, err3 = meter.Int64Counter("mlxserving.model.evictions", metric.WithDescription("Models unloaded by the manager, by reason (budget, idle)."), metric.WithUnit("{eviction}"))
	m.loaded, err4 = meter.Int64UpDownCounter("mlxserving.models.loaded", metric.WithDescription("Models loaded now."), metric.WithUnit("{model}"))
	used, err5 := meter.Int64ObservableGauge("mlxserving.models.memory.used", metric.WithDescription("Memory the loaded models take (and loads under way reserve)."), metric.WithUnit("By"))
	budget, err6 := meter.Int64ObservableGauge("mlxserving.models.memory.budget", metric.WithDescription("The memory budget; 0 when none."), metric.WithUnit("By"))
	if err := errors.Join(err1, err2, err3, err4, err5, err6); err != nil {
		return nil, err
	}
	reg, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		u, b := g.Memory()
		o.ObserveInt64(used, u)
		o.ObserveInt64(budget, b)
		return nil
	}, used, budget)
	if err != nil {
		return nil, err
	}
	m.registration = reg
	return m, nil
}

func (m *managerMetrics) load(model, outcome string, took time.Duration) {
	ctx := context.Background()
	attrs := metric.WithAttributes(attribute.String("model", model), attribute.String("outcome", outcome))
	m.loads.Add(ctx, 1, attrs)
	m.loadSeconds.Record(ctx, took.Seconds(), attrs)
}

func (m *managerMetrics) evicted(model, reason string) {
	m.evictions.Add(context.Background(), 1, metric.WithAttributes(attribute.String("model", model), attribute.String("reason", reason)))
}

func (m *managerMetrics) close() error { return m.registration.Unregister() }

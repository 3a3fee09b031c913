package balancer_test

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/mlxserving/mlxserving/balancer"
)

// The balancer's instruments report what Stats does: requests routed and
// failed over, and each backend's breaker and health.
func TestBalancerMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	lb := newBalancer(t, balancer.WithStrategy(balancer.RoundRobin()), balancer.WithMeterProvider(mp))
	dead, live := newInstance(t, 0), newInstance(t, 0)
	_ = lb.Add("a-dead", dead.srv)
	_ = lb.Add("b-live", live.srv)
	_ = dead.srv.Close()
	for range 6 {
		st, err := lb.Generate(context.Background(), request("m", 2))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Collect(); err != nil {
			t.Fatal(err)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					r, _ := p.Attributes.Value("result")
					got[m.Name+"/"+r.AsString()] = p.Value
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					b, ok := p.Attributes.Value("backend")
					if !ok {
						b, _ = p.Attributes.Value("breaker")
					}
					got[m.Name+"/"+b.AsString()] = p.Value
				}
			}
		}
	}
	if got["mlxserving.lb.requests/routed"] != 6 || got["mlxserving.lb.requests/failover"] == 0 {
		t.Errorf("request counts: %v", got)
	}
	if got["mlxserving.breaker.state/a-dead"] != 2 || got["mlxserving.breaker.state/b-live"] != 0 {
		t.Errorf("breaker states: %v", got)
	}
	if got["mlxserving.lb.backend.healthy/b-live"] != 1 {
		t.Errorf("health: %v", got)
	}
}

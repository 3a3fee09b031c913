package balancer_test

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
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
	got := collect(t, reader)
	if got["mlxserving.lb.requests/result=routed"] != 6 || got["mlxserving.lb.requests/result=failover"] == 0 {
		t.Errorf("request counts: %v", got)
	}
	if got["mlxserving.lb.backend.requests/backend=b-live,result=routed"] != 6 || got["mlxserving.lb.backend.requests/backend=a-dead,result=failover"] == 0 ||
		got["mlxserving.lb.backend.requests/backend=a-dead,result=routed"] != 0 {
		t.Errorf("per-backend request counts: %v", got)
	}
	if got["mlxserving.breaker.state/breaker=a-dead"] != 2 || got["mlxserving.breaker.state/breaker=b-live"] != 0 {
		t.Errorf("breaker states: %v", got)
	}
	if got["mlxserving.lb.backend.healthy/backend=b-live"] != 1 || got["mlxserving.lb.backend.draining/backend=b-live"] != 0 {
		t.Errorf("health, draining: %v", got)
	}
	if got["mlxserving.lb.route.duration/count"] != 6 {
		t.Errorf("routing latency: %v samples, want 6 (one per request)", got["mlxserving.lb.route.duration/count"])
	}
}

// collect reads every instrument reader holds: sums and gauges as
// "name/attr=value,…" (attributes sorted), histograms as "name/count" and
// "name/sum".
func collect(t *testing.T, reader sdkmetric.Reader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	key := func(name string, set attribute.Set) string {
		var kv []string
		for _, a := range set.ToSlice() {
			kv = append(kv, string(a.Key)+"="+a.Value.Emit())
		}
		return name + "/" + strings.Join(kv, ",")
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					got[key(m.Name, p.Attributes)] = float64(p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					got[key(m.Name, p.Attributes)] = float64(p.Value)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					got[m.Name+"/count"] += float64(p.Count)
					got[m.Name+"/sum"] += p.Sum
				}
			}
		}
	}
	return got
}

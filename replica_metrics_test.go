package mlxserving_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// TestMetricAttributesTellServersApart: two Servers of one model share a
// meter provider, each with its replica attribute; every request counter
// and running-sequences gauge point says which Server it is, and each
// Server's request is counted once, under its own replica.
func TestMetricAttributesTellServersApart(t *testing.T) {
	mp := newTestMeter(t)
	replicas := []string{"0", "1"}
	for _, r := range replicas {
		srv := simServer(t, 0, 4, mlxserving.WithMeterProvider(mp), mlxserving.WithMetricAttributes(attribute.String("replica", r)))
		st, err := srv.Generate(context.Background(), api.Request{Model: "sim", PromptTokens: []int32{1, 2, 3}, Params: api.Params{MaxTokens: 2}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Collect(); err != nil {
			t.Fatal(err)
		}
	}
	requests, running := map[string]int64{}, map[string]int{}
	for _, m := range mp.metrics(t) {
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			if m.Name != "mlxserving.requests" {
				continue
			}
			for _, p := range d.DataPoints {
				r, ok := p.Attributes.Value("replica")
				if !ok {
					t.Fatalf("requests point without a replica: %v", p.Attributes)
				}
				requests[r.AsString()] += p.Value
			}
		case metricdata.Gauge[int64]:
			if m.Name != "mlxserving.sequences.running" {
				continue
			}
			for _, p := range d.DataPoints {
				r, ok := p.Attributes.Value("replica")
				if !ok {
					t.Fatalf("running point without a replica: %v", p.Attributes)
				}
				running[r.AsString()]++
			}
		}
	}
	for _, r := range replicas {
		if requests[r] != 1 || running[r] != 1 {
			t.Errorf("replica %s: %d requests counted, %d running points; want 1 and 1 (all: %v, %v)", r, requests[r], running[r], requests, running)
		}
	}
}

func TestMetricAttributesRefuseInvalid(t *testing.T) {
	sim, err := enginetest.NewSim()
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	if _, err := mlxserving.New(sim, mlxserving.WithMetricAttributes(attribute.KeyValue{})); err == nil {
		t.Fatal("New accepted an attribute without a key")
	}
}

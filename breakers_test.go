package mlxserving_test

import (
	"context"
	"slices"
	"testing"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// breakerEngine is the simulated engine with two workers behind
// breakers, the second one open.
type breakerEngine struct{ *enginetest.Sim }

func (breakerEngine) Breakers() []engine.BreakerStatus {
	return []engine.BreakerStatus{{Name: "worker-0"}, {Name: "worker-1", State: engine.BreakerOpen, Failures: 3}}
}

var _ engine.WorkerBreakers = breakerEngine{}

// TestWorkerBreakers: the breakers of an engine that implements
// engine.WorkerBreakers reach Stats and the breaker-state gauge.
func TestWorkerBreakers(t *testing.T) {
	sim, err := enginetest.NewSim()
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	mp := newTestMeter(t)
	eng := breakerEngine{sim}
	srv, err := mlxserving.New(eng, mlxserving.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "sim"}); err != nil {
		t.Fatal(err)
	}
	if got := srv.Stats()["sim"].Breakers; !slices.Equal(got, eng.Breakers()) {
		t.Errorf("Stats breakers %+v, want %+v", got, eng.Breakers())
	}
	got := map[string]int64{}
	for _, m := range mp.metrics(t) {
		if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "mlxserving.breaker.state" {
			for _, p := range g.DataPoints {
				name, _ := p.Attributes.Value("breaker")
				got[name.AsString()] = p.Value
			}
		}
	}
	if got["worker-0"] != int64(engine.BreakerClosed) || got["worker-1"] != int64(engine.BreakerOpen) || len(got) != 2 {
		t.Errorf("breaker gauge %v", got)
	}
}

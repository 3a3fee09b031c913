package mlxserving_test

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/mlxserving/mlxserving"
)

// testMeter is a meter provider whose metrics a test reads back. It shuts
// down when the test ends.
type testMeter struct {
	*sdkmetric.MeterProvider
	reader *sdkmetric.ManualReader
}

func newTestMeter(t testing.TB) testMeter {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return testMeter{mp, reader}
}

// metrics collects what was recorded: every scope's metrics in one list.
func (m testMeter) metrics(t testing.TB) []metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var out []metricdata.Metrics
	for _, sm := range rm.ScopeMetrics {
		out = append(out, sm.Metrics...)
	}
	return out
}

// histogram is the sum and count of the float64 histogram name, over
// every attribute set; 0, 0 when nothing was recorded.
func histogram(t testing.TB, m testMeter, name string) (float64, uint64) {
	t.Helper()
	var sum float64
	var n uint64
	for _, md := range m.metrics(t) {
		if md.Name != name {
			continue
		}
		h, ok := md.Data.(metricdata.Histogram[float64])
		if !ok {
			t.Fatalf("%s is a %T, want a float64 histogram", name, md.Data)
		}
		for _, dp := range h.DataPoints {
			sum += dp.Sum
			n += dp.Count
		}
	}
	return sum, n
}

// TestStepMetrics: every engine step is recorded (mlxserving.step.duration),
// and the batcher's time between steps (mlxserving.step.between) for
// every step but the first after a wait for work.
func TestStepMetrics(t *testing.T) {
	tm := newTestMeter(t)
	srv, sim := simServerAndEngine(t, time.Millisecond, 8, mlxserving.WithMeterProvider(tm))
	if got := runStreams(t, srv, 4, 16); got != 64 {
		t.Fatalf("%d tokens, want 64", got)
	}
	steps := sim.Stats().Steps
	var n, between uint64
	var sum float64
	for range 1000 { // the loop records a step after delivering its tokens
		_, n = histogram(t, tm, "mlxserving.step.duration")
		sum, between = histogram(t, tm, "mlxserving.step.between")
		if n == uint64(steps) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if n != uint64(steps) {
		t.Fatalf("mlxserving.step.duration counts %d steps, the engine ran %d", n, steps)
	}
	if between == 0 || between >= n || sum <= 0 {
		t.Errorf("mlxserving.step.between: %d steps summing %.6fs; want all but the first after a wait of the %d steps, positive", between, sum, n)
	}
}

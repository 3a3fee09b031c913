package mlxserving_test

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
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

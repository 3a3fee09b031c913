package openai

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// httpMetrics counts requests by route and status.
type httpMetrics struct {
	requests metric.Int64Counter
	duration metric.Float64Histogram

	mu    sync.Mutex
	attrs map[routeStatus]metric.MeasurementOption // cached, so recording does not allocate
}

type routeStatus struct {
	route  string
	status int
}

func newHTTPMetrics(mp metric.MeterProvider) (*httpMetrics, error) {
	meter := mp.Meter("github.com/mlxserving/mlxserving/openai")
	requests, err1 := meter.Int64Counter("mlxserving.http.requests",
		metric.WithDescription("HTTP requests by route and status code."), metric.WithUnit("{request}"))
	duration, err2 := meter.Float64Histogram("mlxserving.http.request.duration",
		metric.WithDescription("HTTP request duration, to the end of the response (the whole stream)."), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120))
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return &httpMetrics{requests: requests, duration: duration, attrs: make(map[routeStatus]metric.MeasurementOption)}, nil
}

func (m *httpMetrics) record(ctx context.Context, route string, status int, d time.Duration) {
	if status == 0 {
		status = http.StatusOK
	}
	k := routeStatus{route, status}
	m.mu.Lock()
	attrs, ok := m.attrs[k]
	if !ok {
		attrs = metric.WithAttributeSet(attribute.NewSet(
			attribute.String("http.route", route), attribute.String("http.response.status_code", strconv.Itoa(status))))
		m.attrs[k] = attrs
	}
	m.mu.Unlock()
	ctx = context.WithoutCancel(ctx)
	m.requests.Add(ctx, 1, attrs)
	m.duration.Record(ctx, d.Seconds(), attrs)
}

// statusRecorder remembers the status a handler wrote. Unwrap lets
// http.ResponseController reach the connection's Flush.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

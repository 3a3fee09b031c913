package httpbackend_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/balancer/httpbackend"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/openai"
	"github.com/mlxserving/mlxserving/testmodel"
)

// upstream is a real mlxserving Server on the simulated engine
// (enginetest.Sim) with the project's test checkpoint, behind the OpenAI
// handler on a loopback httptest server, with Prometheus /metrics.
type upstream struct {
	sim *enginetest.Sim
	srv *mlxserving.Server
	ts  *httptest.Server

	mu      sync.Mutex
	headers []http.Header // request headers seen, in order
}

func newUpstream(t testing.TB, simOpts []enginetest.SimOption, srvOpts ...mlxserving.Option) *upstream {
	t.Helper()
	dir := t.TempDir()
	cfg := testmodel.Tiny()
	if err := testmodel.Write(dir, cfg); err != nil {
		t.Fatal(err)
	}
	sim, err := enginetest.NewSim(append([]enginetest.SimOption{enginetest.WithVocabSize(cfg.Vocab), enginetest.WithContextLength(cfg.ContextLength)}, simOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	srv, err := mlxserving.New(sim, append([]mlxserving.Option{mlxserving.WithMeterProvider(mp)}, srvOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir}); err != nil {
		t.Fatal(err)
	}
	h, err := openai.New(srv, openai.WithMetricsHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{sim: sim, srv: srv}
	u.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.headers = append(u.headers, r.Header.Clone())
		u.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		u.ts.Close()
		_ = srv.Close()
		_ = mp.Shutdown(context.Background())
		_ = sim.Close()
	})
	return u
}

func (u *upstream) lastHeader() http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	for i := len(u.headers) - 1; i >= 0; i-- {
		if u.headers[i].Get("Content-Type") == "application/json" {
			return u.headers[i]
		}
	}
	return nil
}

func newBackend(t testing.TB, url string, opts ...httpbackend.Option) *httpbackend.Backend {
	t.Helper()
	b, err := httpbackend.New(url, append([]httpbackend.Option{httpbackend.WithPollInterval(time.Hour)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// waitFor polls cond until it holds or a few seconds pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

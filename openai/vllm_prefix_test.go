package openai_test

import (
	"context"
	"net/http"
	"regexp"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/openai"
)

// TestPrefixCacheMetrics: /metrics carries the prefix-cache counters in
// tokens under the library's names and under vLLM's.
func TestPrefixCacheMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	f := newFixture(t, fixtureOpts{server: []mlxserving.Option{mlxserving.WithMeterProvider(mp)},
		handler: []openai.Option{openai.WithMetricsHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))}})
	if err := reg.Register(openai.PrefixCacheCollector(f.srv)); err != nil {
		t.Fatal(err)
	}
	prompt := make([]int, 40)
	for i := range prompt {
		prompt[i] = 5 + i
	}
	for i := range 3 {
		p := append(append([]int(nil), prompt...), 100+i)
		if status, _, body := f.post(t, "/v1/completions", map[string]any{"model": "tiny", "prompt": p, "max_tokens": 2}); status != http.StatusOK {
			t.Fatalf("status %d: %s", status, body)
		}
	}
	status, body := f.get(t, "/metrics")
	if status != http.StatusOK {
		t.Fatalf("/metrics status %d", status)
	}
	value := func(re string) float64 {
		m := regexp.MustCompile(`(?m)^` + re + `(?:\{[^}]*model(?:_name)?="tiny"[^}]*\})? (\S+)$`).FindSubmatch(body)
		if m == nil {
			t.Fatalf("/metrics has no %s for tiny:\n%s", re, body)
		}
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		return v
	}
	if q, h := value(`vllm:prefix_cache_queries_total`), value(`vllm:prefix_cache_hits_total`); q != 3*41 || h != 2*40 {
		t.Errorf("vLLM counters: queries %v, hits %v; want 123 and 80", q, h)
	}
	if q, h := value(`mlxserving_prefix_cache_queries_total`), value(`mlxserving_prefix_cache_hits_total`); q != 3*41 || h != 2*40 {
		t.Errorf("library counters: queries %v, hits %v; want 123 and 80", q, h)
	}
}

package vllm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.uber.org/goleak"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/openai"
	"github.com/mlxserving/mlxserving/openai/vllm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
	sim, err := enginetest.NewSim(enginetest.WithVocabSize(500))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	srv, err := mlxserving.New(sim, mlxserving.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "tiny"}); err != nil {
		t.Fatal(err)
	}
	if err := reg.Register(vllm.PrefixCacheCollector(srv)); err != nil {
		t.Fatal(err)
	}
	h, err := openai.New(srv, openai.WithMetricsHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	defer ts.Close()
	prompt := make([]int, 40)
	for i := range prompt {
		prompt[i] = 5 + i
	}
	for i := range 3 {
		body, _ := json.Marshal(map[string]any{"model": "tiny", "prompt": append(append([]int(nil), prompt...), 100+i), "max_tokens": 2})
		resp, err := ts.Client().Post(ts.URL+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
	}
	resp, err := ts.Client().Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	value := func(name string) float64 {
		m := regexp.MustCompile(`(?m)^` + name + `\{[^}]*model(?:_name)?="tiny"[^}]*\} (\S+)$`).FindSubmatch(body)
		if m == nil {
			t.Fatalf("/metrics has no %s for tiny:\n%s", name, body)
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

// TestPrefixCacheCollectorSumsServers: replicas of one model are one
// model to a vLLM router: the counters are the sums of the Servers'.
func TestPrefixCacheCollectorSumsServers(t *testing.T) {
	var srvs []*mlxserving.Server
	var queries, hits int64
	for i := range 2 {
		srv := tinyServer(t)
		prompt := make([]int32, 40)
		for j := range prompt {
			prompt[j] = int32(5 + j + i)
		}
		for range 2 + i { // 2 requests on the first, 3 on the second: a hit each after the first
			st, err := srv.Generate(context.Background(), api.Request{Model: "tiny", PromptTokens: prompt, Params: api.Params{MaxTokens: 2}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.Collect(); err != nil {
				t.Fatal(err)
			}
		}
		pc := srv.Stats()["tiny"].PrefixCache
		if pc.Queries == 0 || pc.Hits == 0 {
			t.Fatalf("server %d: prefix cache %+v: want queries and hits", i, pc)
		}
		queries, hits = queries+pc.Queries, hits+pc.Hits
		srvs = append(srvs, srv)
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(vllm.PrefixCacheCollector(srvs...)); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			got[f.GetName()] += m.GetCounter().GetValue()
		}
	}
	if got["vllm:prefix_cache_queries_total"] != float64(queries) || got["vllm:prefix_cache_hits_total"] != float64(hits) {
		t.Errorf("collector %v; want queries %d and hits %d, the sums of the servers'", got, queries, hits)
	}
}

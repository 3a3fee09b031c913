package openai

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mlxserving/mlxserving"
)

// PrefixCacheCollector exports a Server's prefix-cache counters under
// vLLM's metric names, so dashboards built for vLLM carry over:
// vllm:prefix_cache_queries_total (prompt tokens looked up) and
// vllm:prefix_cache_hits_total (prompt tokens reused from saved KV), per
// model_name, as vLLM's Prometheus exposition names its counters
// vllm:prefix_cache_queries and vllm:prefix_cache_hits. The names carry a
// colon, which OpenTelemetry instrument names cannot, hence a Prometheus
// collector of its own; register it beside the OpenTelemetry exporter on
// the registry behind /metrics. It reads Server.Stats when scraped.
func PrefixCacheCollector(srv *mlxserving.Server) prometheus.Collector {
	return &prefixCollector{
		srv:     srv,
		queries: prometheus.NewDesc("vllm:prefix_cache_queries_total", "Prefix cache queries, in prompt tokens.", []string{"model_name"}, nil),
		hits:    prometheus.NewDesc("vllm:prefix_cache_hits_total", "Prefix cache hits, in prompt tokens.", []string{"model_name"}, nil),
	}
}

type prefixCollector struct {
	srv           *mlxserving.Server
	queries, hits *prometheus.Desc
}

func (c *prefixCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.queries
	ch <- c.hits
}

func (c *prefixCollector) Collect(ch chan<- prometheus.Metric) {
	for id, st := range c.srv.Stats() {
		ch <- prometheus.MustNewConstMetric(c.queries, prometheus.CounterValue, float64(st.PrefixCache.Queries), id)
		ch <- prometheus.MustNewConstMetric(c.hits, prometheus.CounterValue, float64(st.PrefixCache.Hits), id)
	}
}

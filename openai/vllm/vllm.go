// Package vllm exports a Server's figures as Prometheus metrics under the
// names vLLM gives them, so dashboards and alerts built for vLLM carry
// over. The names carry a colon, which OpenTelemetry instrument names
// cannot, hence Prometheus collectors of their own, registered beside the
// OpenTelemetry exporter on the registry behind /metrics:
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(vllm.PrefixCacheCollector(srv))
package vllm

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mlxserving/mlxserving"
)

// PrefixCacheCollector exports a Server's prefix-cache counters:
// vllm:prefix_cache_queries_total (prompt tokens looked up) and
// vllm:prefix_cache_hits_total (prompt tokens reused from saved KV), per
// model_name — vLLM's counters vllm:prefix_cache_queries and
// vllm:prefix_cache_hits as its Prometheus exposition names them. It reads
// Server.Stats when scraped.
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

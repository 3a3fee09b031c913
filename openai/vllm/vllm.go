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
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mlxserving/mlxserving"
)

// PrefixCacheCollector exports Servers' prefix-cache counters:
// vllm:prefix_cache_queries_total (prompt tokens looked up) and
// vllm:prefix_cache_hits_total (prompt tokens reused from saved KV), per
// model_name — vLLM's counters vllm:prefix_cache_queries and
// vllm:prefix_cache_hits as its Prometheus exposition names them —
// summed over the Servers given (replicas of a model serve it together).
// It reads Server.Stats when scraped.
func PrefixCacheCollector(srvs ...*mlxserving.Server) prometheus.Collector {
	return &prefixCollector{
		srvs:    slices.Clone(srvs),
		queries: prometheus.NewDesc("vllm:prefix_cache_queries_total", "Prefix cache queries, in prompt tokens.", []string{"model_name"}, nil),
		hits:    prometheus.NewDesc("vllm:prefix_cache_hits_total", "Prefix cache hits, in prompt tokens.", []string{"model_name"}, nil),
	}
}

type prefixCollector struct {
	srvs          []*mlxserving.Server
	queries, hits *prometheus.Desc
}

func (c *prefixCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.queries
	ch <- c.hits
}

func (c *prefixCollector) Collect(ch chan<- prometheus.Metric) {
	type counts struct{ queries, hits int64 }
	models := map[string]counts{}
	for _, srv := range c.srvs {
		for id, st := range srv.Stats() {
			n := models[id]
			n.queries += st.PrefixCache.Queries
			n.hits += st.PrefixCache.Hits
			models[id] = n
		}
	}
	for id, n := range models {
		ch <- prometheus.MustNewConstMetric(c.queries, prometheus.CounterValue, float64(n.queries), id)
		ch <- prometheus.MustNewConstMetric(c.hits, prometheus.CounterValue, float64(n.hits), id)
	}
}

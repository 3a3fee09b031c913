package openai

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/scheduler"
)

// LoadSource is what the vLLM-named gauges read: a load report, as a
// *mlxserving.Server or a scheduler.LoadBalancer gives. A source that also
// has per-model stats (Stats() map[string]mlxserving.ModelStats, as a
// Server has) is reported per model.
type LoadSource interface {
	Load() scheduler.Load
}

type modelStatser interface {
	Stats() map[string]mlxserving.ModelStats
}

// DefaultVLLMBlockSize is the KV block size vllm:cache_config_info reports
// unless WithVLLMBlockSize says otherwise: vLLM's default.
const DefaultVLLMBlockSize = 16

// VLLMOption configures NewVLLMCollector.
type VLLMOption func(*vllmCollector) error

// WithVLLMBlockSize sets the block size vllm:cache_config_info reports and
// divides the KV capacity by for num_gpu_blocks. It must be positive.
func WithVLLMBlockSize(n int) VLLMOption {
	return func(c *vllmCollector) error {
		if n <= 0 {
			return fmt.Errorf("vllm block size %d: must be positive", n)
		}
		c.blockSize = n
		return nil
	}
}

// vllmCollector exposes the load under vLLM's metric names.
type vllmCollector struct {
	src       LoadSource
	blockSize int
	waiting   *prometheus.Desc
	running   *prometheus.Desc
	kvUsage   *prometheus.Desc
	cacheInfo *prometheus.Desc
}

// NewVLLMCollector returns a prometheus.Collector exposing src's queue,
// running sequences and KV use under vLLM's metric names, read at scrape
// time, so routers built for vLLM (the Gateway API inference extension,
// llm-d) can route to mlxserving:
//
//   - vllm:num_requests_waiting — requests queued, per model_name
//   - vllm:num_requests_running — sequences in running batches
//   - vllm:kv_cache_usage_perc — fraction of KV capacity in use, 0 to 1
//   - vllm:cache_config_info — 1, labelled block_size and num_gpu_blocks
//
// Register it on the registry /metrics serves:
//
//	reg.MustRegister(openai.NewVLLMCollector(srv))
func NewVLLMCollector(src LoadSource, opts ...VLLMOption) (prometheus.Collector, error) {
	if src == nil {
		return nil, errors.New("openai: vllm collector: load source is nil")
	}
	c := &vllmCollector{
		src: src, blockSize: DefaultVLLMBlockSize,
		waiting: prometheus.NewDesc("vllm:num_requests_waiting", "Number of requests waiting to be processed.", []string{"model_name"}, nil),
		running: prometheus.NewDesc("vllm:num_requests_running", "Number of requests in model execution batches.", []string{"model_name"}, nil),
		kvUsage: prometheus.NewDesc("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", []string{"model_name"}, nil),
		cacheInfo: prometheus.NewDesc("vllm:cache_config_info", "Information of the KV cache configuration.",
			[]string{"model_name", "block_size", "num_gpu_blocks"}, nil),
	}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, fmt.Errorf("openai: vllm collector: %w", err)
		}
	}
	return c, nil
}

// Describe sends the four descriptors.
func (c *vllmCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.waiting
	ch <- c.running
	ch <- c.kvUsage
	ch <- c.cacheInfo
}

// Collect reads the source now.
func (c *vllmCollector) Collect(ch chan<- prometheus.Metric) {
	if s, ok := c.src.(modelStatser); ok {
		stats := s.Stats()
		ids := make([]string, 0, len(stats))
		for id := range stats {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			st := stats[id]
			kv := 0.0
			if st.Batcher.KVCapacity > 0 {
				kv = float64(st.Batcher.KVReserved) / float64(st.Batcher.KVCapacity)
			}
			c.send(ch, id, st.Queue.Queued, st.Batcher.Running, kv, st.Batcher.KVCapacity)
		}
		return
	}
	l := c.src.Load()
	name := ""
	if len(l.Models) == 1 {
		name = l.Models[0]
	}
	c.send(ch, name, l.Waiting, l.Running, l.KVUsage, 0)
}

func (c *vllmCollector) send(ch chan<- prometheus.Metric, model string, waiting, running int, kv float64, kvTokens int) {
	ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(waiting), model)
	ch <- prometheus.MustNewConstMetric(c.running, prometheus.GaugeValue, float64(running), model)
	ch <- prometheus.MustNewConstMetric(c.kvUsage, prometheus.GaugeValue, kv, model)
	ch <- prometheus.MustNewConstMetric(c.cacheInfo, prometheus.GaugeValue, 1,
		model, strconv.Itoa(c.blockSize), strconv.Itoa(kvTokens/c.blockSize))
}

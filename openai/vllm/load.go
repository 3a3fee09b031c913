package vllm

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/balancer"
)

// LoadSource is what LoadCollector reads: a load report, as a
// *mlxserving.Server or a balancer.LoadBalancer gives. A source that also
// has per-model stats (Stats() map[string]mlxserving.ModelStats, as a
// Server has) is reported per model.
type LoadSource interface {
	Load() balancer.Load
}

type modelStatser interface {
	Stats() map[string]mlxserving.ModelStats
}

// DefaultBlockSize is the KV block size vllm:cache_config_info reports
// unless WithBlockSize says otherwise: vLLM's default.
const DefaultBlockSize = 16

// Option configures LoadCollector.
type Option func(*loadCollector) error

// WithBlockSize sets the block size vllm:cache_config_info reports and
// divides the KV capacity by for num_gpu_blocks. It must be positive.
func WithBlockSize(n int) Option {
	return func(c *loadCollector) error {
		if n <= 0 {
			return fmt.Errorf("block size %d: must be positive", n)
		}
		c.blockSize = n
		return nil
	}
}

type loadCollector struct {
	src       LoadSource
	blockSize int
	waiting   *prometheus.Desc
	running   *prometheus.Desc
	kvUsage   *prometheus.Desc
	cacheInfo *prometheus.Desc
}

// LoadCollector exports src's queue, running sequences and KV use under
// vLLM's gauge names, read at scrape time, so routers built for vLLM (the
// Gateway API inference extension, llm-d) can route to mlxserving:
//
//   - vllm:num_requests_waiting — requests queued, per model_name
//   - vllm:num_requests_running — sequences in running batches
//   - vllm:kv_cache_usage_perc — fraction of KV capacity in use, 0 to 1
//   - vllm:cache_config_info — 1, labelled block_size and num_gpu_blocks
//
// A source without per-model stats (a balancer) is one series, labelled
// with its model when it serves exactly one, else "".
func LoadCollector(src LoadSource, opts ...Option) (prometheus.Collector, error) {
	if src == nil {
		return nil, errors.New("vllm: load collector: source is nil")
	}
	c := &loadCollector{
		src: src, blockSize: DefaultBlockSize,
		waiting: prometheus.NewDesc("vllm:num_requests_waiting", "Number of requests waiting to be processed.", []string{"model_name"}, nil),
		running: prometheus.NewDesc("vllm:num_requests_running", "Number of requests in model execution batches.", []string{"model_name"}, nil),
		kvUsage: prometheus.NewDesc("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", []string{"model_name"}, nil),
		cacheInfo: prometheus.NewDesc("vllm:cache_config_info", "Information of the KV cache configuration.",
			[]string{"model_name", "block_size", "num_gpu_blocks"}, nil),
	}
	for _, o := range opts {
		if o == nil { // nil options are skipped, as nats.go does
			continue
		}
		if err := o(c); err != nil {
			return nil, fmt.Errorf("vllm: load collector: %w", err)
		}
	}
	return c, nil
}

func (c *loadCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.waiting
	ch <- c.running
	ch <- c.kvUsage
	ch <- c.cacheInfo
}

func (c *loadCollector) Collect(ch chan<- prometheus.Metric) {
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

func (c *loadCollector) send(ch chan<- prometheus.Metric, model string, waiting, running int, kv float64, kvTokens int) {
	ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(waiting), model)
	ch <- prometheus.MustNewConstMetric(c.running, prometheus.GaugeValue, float64(running), model)
	ch <- prometheus.MustNewConstMetric(c.kvUsage, prometheus.GaugeValue, kv, model)
	ch <- prometheus.MustNewConstMetric(c.cacheInfo, prometheus.GaugeValue, 1,
		model, strconv.Itoa(c.blockSize), strconv.Itoa(kvTokens/c.blockSize))
}

package openai_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/openai"
)

// TestVLLMGauges: /metrics carries the Server's queue, running sequences
// and KV use under vLLM's names, read at scrape time.
func TestVLLMGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := newFixture(t, fixtureOpts{
		sim:     []enginetest.SimOption{enginetest.WithStepTime(5*time.Millisecond, 0), enginetest.WithMaxBatch(2), enginetest.WithKVCapacity(4096)},
		handler: []openai.Option{openai.WithMetricsHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))},
	})
	c, err := openai.NewVLLMCollector(f.srv, openai.WithVLLMBlockSize(16))
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(c)

	scrape := func() map[string]float64 {
		status, body := f.get(t, "/metrics")
		if status != 200 {
			t.Fatalf("/metrics %d", status)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
		if err != nil {
			t.Fatalf("parse /metrics: %v\n%s", err, body)
		}
		out := map[string]float64{}
		for name, fam := range fams {
			for _, m := range fam.GetMetric() {
				labels := map[string]string{}
				for _, lp := range m.GetLabel() {
					labels[lp.GetName()] = lp.GetValue()
				}
				if labels["model_name"] != "tiny" {
					t.Errorf("%s has model_name %q", name, labels["model_name"])
				}
				if name == "vllm:cache_config_info" && (labels["block_size"] != "16" || labels["num_gpu_blocks"] != "256") {
					t.Errorf("cache_config_info labels %v", labels)
				}
				out[name] = m.GetGauge().GetValue()
			}
		}
		return out
	}
	idle := scrape()
	if idle["vllm:num_requests_running"] != 0 || idle["vllm:num_requests_waiting"] != 0 || idle["vllm:cache_config_info"] != 1 {
		t.Errorf("idle: %v", idle)
	}
	// Three long requests on a batch of two: two run, one waits.
	var streams []*api.Stream
	for range 3 {
		st, err := f.srv.Generate(context.Background(), api.Request{Model: "tiny", PromptTokens: []int32{1, 2, 3}, Params: api.Params{MaxTokens: 400, IgnoreEOS: true}})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		streams = append(streams, st)
	}
	for _, st := range streams[:2] {
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	busy := scrape()
	if busy["vllm:num_requests_running"] != 2 || busy["vllm:num_requests_waiting"] != 1 {
		t.Errorf("busy: %v, want 2 running and 1 waiting", busy)
	}
	if kv := busy["vllm:kv_cache_usage_perc"]; kv <= 0 || kv > 1 {
		t.Errorf("kv usage %v", kv)
	}
	if _, err := openai.NewVLLMCollector(nil); err == nil {
		t.Error("nil source accepted")
	}
	if _, err := openai.NewVLLMCollector(f.srv, openai.WithVLLMBlockSize(0)); err == nil {
		t.Error("block size 0 accepted")
	}
}

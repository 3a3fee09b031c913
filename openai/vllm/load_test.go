package vllm_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/openai/vllm"
)

// gather scrapes reg: value per metric name, checking every series is
// labelled model_name=want.
func gather(t *testing.T, reg *prometheus.Registry, want string) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["model_name"] != want {
				t.Errorf("%s: model_name %q, want %q", f.GetName(), labels["model_name"], want)
			}
			if f.GetName() == "vllm:cache_config_info" && labels["block_size"] != "16" {
				t.Errorf("cache_config_info labels %v", labels)
			}
			out[f.GetName()] = m.GetGauge().GetValue()
		}
	}
	return out
}

// TestLoadCollector: a Server's queue, running sequences and KV use under
// vLLM's gauge names, per model, read at scrape time; over a balancer, one
// series.
func TestLoadCollector(t *testing.T) {
	srv := tinyServer(t, enginetest.WithStepTime(5*time.Millisecond, 0), enginetest.WithMaxBatch(2), enginetest.WithKVCapacity(4096))
	reg := prometheus.NewRegistry()
	c, err := vllm.LoadCollector(srv)
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(c)
	lb, err := balancer.New()
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	if err := lb.Add("one", srv); err != nil {
		t.Fatal(err)
	}
	lbReg := prometheus.NewRegistry()
	lc, _ := vllm.LoadCollector(lb)
	lbReg.MustRegister(lc)

	idle := gather(t, reg, "tiny")
	if idle["vllm:num_requests_running"] != 0 || idle["vllm:num_requests_waiting"] != 0 || idle["vllm:cache_config_info"] != 1 {
		t.Errorf("idle: %v", idle)
	}
	// Three long requests on a batch of two: two run, one waits.
	var streams []*api.Stream
	for range 3 {
		st, err := srv.Generate(context.Background(), api.Request{Model: "tiny", PromptTokens: []int32{1, 2, 3}, Params: api.Params{MaxTokens: 400, IgnoreEOS: true}})
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
	// The balancer reports the load snapshot it routes from, refreshed
	// every balancer.DefaultLoadRefresh: wait for it to take the requests in.
	viaLB := gather(t, lbReg, "tiny")
	for deadline := time.Now().Add(5 * time.Second); viaLB["vllm:num_requests_running"] != 2 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		viaLB = gather(t, lbReg, "tiny")
	}
	for _, got := range []map[string]float64{gather(t, reg, "tiny"), viaLB} {
		if got["vllm:num_requests_running"] != 2 || got["vllm:num_requests_waiting"] != 1 {
			t.Errorf("busy: %v, want 2 running and 1 waiting", got)
		}
		if kv := got["vllm:kv_cache_usage_perc"]; kv <= 0 || kv > 1 {
			t.Errorf("kv usage %v", kv)
		}
	}
	if _, err := vllm.LoadCollector(nil); err == nil {
		t.Error("nil source accepted")
	}
	if _, err := vllm.LoadCollector(srv, vllm.WithBlockSize(0)); err == nil {
		t.Error("block size 0 accepted")
	}
}

// tinyServer is a Server of the simulated engine (a vocabulary of 500 and
// opts) with the model "tiny" loaded; both close when the test ends.
func tinyServer(t *testing.T, opts ...enginetest.SimOption) *mlxserving.Server {
	t.Helper()
	sim, err := enginetest.NewSim(append([]enginetest.SimOption{enginetest.WithVocabSize(500)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	srv, err := mlxserving.New(sim)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "tiny"}); err != nil {
		t.Fatal(err)
	}
	return srv
}

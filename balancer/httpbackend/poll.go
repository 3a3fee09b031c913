package httpbackend

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// pollLoop reads the upstream's models and load now and every poll
// interval until Close.
func (b *Backend) pollLoop() {
	defer close(b.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-b.stop
		cancel()
	}()
	tick := time.NewTicker(b.cfg.pollInterval)
	defer tick.Stop()
	for {
		b.poll(ctx)
		select {
		case <-b.stop:
			return
		case <-tick.C:
		}
	}
}

// Refresh polls the upstream now, as the poller does, and returns the
// poll's error.
func (b *Backend) Refresh(ctx context.Context) error { return b.poll(ctx) }

func (b *Backend) poll(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, max(b.cfg.pollInterval, time.Second))
	defer cancel()
	models, err := b.models(ctx)
	if err != nil {
		b.setPollErr(err)
		return err
	}
	g, merr := b.gauges(ctx) // optional: many upstreams have no /metrics
	for _, id := range b.cfg.models {
		if !slices.Contains(models, id) {
			models = append(models, id)
		}
	}
	slices.Sort(models)
	b.mu.RLock()
	l, reports := b.load, b.reports
	b.mu.RUnlock()
	l.Models = models
	l.Updated = time.Now()
	if merr == nil {
		l.Waiting, l.Running, l.KVUsage = g.waiting, g.running, g.kv
	}
	for _, report := range reports { // the balancers first, so they route by it once Load shows it
		r := l
		r.Models = slices.Clone(models)
		report(r)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pollErr != nil {
		b.cfg.logger.Info("upstream answers again", "url", b.base)
	}
	b.pollErr = nil
	b.load = l
	return nil
}

func (b *Backend) setPollErr(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pollErr == nil {
		b.cfg.logger.Debug("upstream poll failed", "url", b.base, "err", err)
	}
	b.pollErr = err
}

// get fetches path, returning its body (at most limit bytes) on a 200.
func (b *Backend) get(ctx context.Context, path string, limit int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.base+path, nil)
	if err != nil {
		return nil, err
	}
	if b.cfg.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+b.cfg.apiKey)
	}
	resp, err := b.cfg.client.Do(req)
	if err != nil {
		return nil, &Error{URL: b.base + path, Err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if resp.StatusCode != http.StatusOK {
		return nil, statusError(b.base+path, resp, body)
	}
	if err != nil {
		return nil, &Error{URL: b.base + path, Err: err}
	}
	return body, nil
}

// models reads /v1/models: {"data": [{"id": ...}, ...]}.
func (b *Backend) models(ctx context.Context) ([]string, error) {
	body, err := b.get(ctx, "/v1/models", 4<<20)
	if err != nil {
		return nil, err
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, &Error{URL: b.base + "/v1/models", Err: protocolError("model list is not JSON", body)}
	}
	ids := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		if m.ID != "" {
			ids = append(ids, m.ID)
		}
	}
	return ids, nil
}

// gaugeValues is the load read from /metrics.
type gaugeValues struct {
	waiting, running int
	kv               float64
}

// Gauge names read from /metrics, vLLM's first. Values are summed over
// their label sets (one per model), KV use is averaged.
var (
	waitingNames = []string{"vllm:num_requests_waiting", "mlxserving_sequences_waiting"}
	runningNames = []string{"vllm:num_requests_running", "mlxserving_sequences_running"}
	kvNames      = []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "mlxserving_kv_usage"}
)

func (b *Backend) gauges(ctx context.Context) (gaugeValues, error) {
	var g gaugeValues
	body, err := b.get(ctx, "/metrics", 16<<20)
	if err != nil {
		return g, err
	}
	families, err := parseMetrics(body)
	if err != nil {
		return g, err
	}
	w, okW := firstFamily(families, waitingNames, false)
	r, okR := firstFamily(families, runningNames, false)
	kv, okKV := firstFamily(families, kvNames, true)
	if !okW && !okR && !okKV {
		return g, fmt.Errorf("httpbackend: %s/metrics has no load gauges", b.base)
	}
	g.waiting, g.running, g.kv = int(w), int(r), min(max(kv, 0), 1)
	return g, nil
}

func parseMetrics(body []byte) (map[string]*dtoFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		return nil, &Error{URL: "/metrics", Err: protocolError("metrics are not Prometheus text: "+err.Error(), nil)}
	}
	out := make(map[string]*dtoFamily, len(fams))
	for name, f := range fams {
		df := &dtoFamily{}
		for _, m := range f.GetMetric() {
			switch {
			case m.GetGauge() != nil:
				df.values = append(df.values, m.GetGauge().GetValue())
			case m.GetCounter() != nil:
				df.values = append(df.values, m.GetCounter().GetValue())
			case m.GetUntyped() != nil:
				df.values = append(df.values, m.GetUntyped().GetValue())
			}
		}
		out[name] = df
	}
	return out, nil
}

type dtoFamily struct{ values []float64 }

// firstFamily returns the sum (or mean) of the first of names present.
func firstFamily(fams map[string]*dtoFamily, names []string, mean bool) (float64, bool) {
	for _, n := range names {
		f, ok := fams[n]
		if !ok || len(f.values) == 0 {
			continue
		}
		var sum float64
		for _, v := range f.values {
			sum += v
		}
		if mean {
			sum /= float64(len(f.values))
		}
		return sum, true
	}
	return 0, false
}

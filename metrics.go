package mlxserving

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

// WithMeterProvider records the Server's metrics through mp: latencies
// (time to first token, inter-token, end to end, queue wait per tier),
// requests by outcome (retry.Class.Outcome of the request's error: ok,
// invalid, not_found, rejected, unavailable, deadline, cancelled, error),
// token counts, prefix-cache reuse, and per model the
// running and waiting sequences, batch size and KV use. The default is a
// no-op provider; the Server never touches a global registry.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error {
		if mp == nil {
			return errors.New("meter provider is nil")
		}
		c.meterProvider = mp
		return nil
	}
}

// WithMetricAttributes adds attributes to every measurement the Server
// records, so that several Servers can share one meter provider: one per
// replica of a model on its own GPUs, told apart by a "replica"
// attribute, as examples/server does with -gpus.
func WithMetricAttributes(kv ...attribute.KeyValue) Option {
	return func(c *config) error {
		for _, a := range kv {
			if !a.Valid() {
				return fmt.Errorf("metric attribute %q is not valid", a.Key)
			}
		}
		c.metricAttrs = append(c.metricAttrs, kv...)
		return nil
	}
}

// metrics holds the Server's instruments.
type metrics struct {
	requests     metric.Int64Counter
	duration     metric.Float64Histogram
	ttft         metric.Float64Histogram
	itl          metric.Float64Histogram
	queueWait    metric.Float64Histogram
	promptTok    metric.Int64Counter
	genTok       metric.Int64Counter
	cachedTok    metric.Int64Counter
	prefixQuery  metric.Int64Counter
	prefixHit    metric.Int64Counter
	preemptions  metric.Int64Counter
	batchSize    metric.Int64Histogram
	stepLatency  metric.Float64Histogram
	stepBetween  metric.Float64Histogram
	resumeGap    metric.Float64Histogram
	embedInputs  metric.Int64Counter
	embedTok     metric.Int64Counter
	embedTime    metric.Float64Histogram
	registration metric.Registration

	base  []attribute.KeyValue // WithMetricAttributes': on every measurement
	mu    sync.Mutex
	attrs map[attrKey]metric.MeasurementOption // cached, so recording does not allocate
}

type attrKey struct {
	model   string
	tier    api.Tier
	outcome string
}

// latencyBuckets are in seconds, from 1 ms to a minute.
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

func newMetrics(mp metric.MeterProvider, base []attribute.KeyValue, s *Server) (*metrics, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	meter := mp.Meter("github.com/mlxserving/mlxserving")
	m := &metrics{base: base, attrs: make(map[attrKey]metric.MeasurementOption)}
	var errs []error
	check := func(err error) { errs = append(errs, err) }
	hist := func(name, desc string) metric.Float64Histogram {
		h, err := meter.Float64Histogram(name, metric.WithDescription(desc), metric.WithUnit("s"),
			metric.WithExplicitBucketBoundaries(latencyBuckets...))
		check(err)
		return h
	}
	counter := func(name, desc, unit string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		check(err)
		return c
	}
	m.requests = counter("mlxserving.requests", "Requests by model, tier and outcome.", "{request}")
	m.duration = hist("mlxserving.request.duration", "End-to-end request latency.")
	m.ttft = hist("mlxserving.time_to_first_token", "Time from submission to the first generated token.")
	m.itl = hist("mlxserving.inter_token_latency", "Time between consecutive tokens of a stream.")
	m.queueWait = hist("mlxserving.queue.wait", "Time from submission to admission into the batch, per tier.")
	m.stepLatency = hist("mlxserving.step.duration", "Engine step latency.")
	m.stepBetween = hist("mlxserving.step.between", "The batcher's time between engine steps: the last step's tokens delivered, admission, the next step's inputs (not recorded for the first step after a wait for work).")
	m.resumeGap = hist("mlxserving.resume.gap", "Time a resume added to a stream, from the last token before its worker was lost to the first after, by cause.")
	m.promptTok = counter("mlxserving.tokens.prompt", "Prompt tokens of finished requests.", "{token}")
	m.genTok = counter("mlxserving.tokens.generated", "Generated tokens of finished requests.", "{token}")
	m.cachedTok = counter("mlxserving.prefix_cache.tokens", "Prompt tokens served from a saved KV prefix instead of prefill.", "{token}")
	m.prefixQuery = counter("mlxserving.prefix_cache.queries", "Prompt tokens looked up in the prefix cache (vLLM's prefix_cache_queries).", "{token}")
	m.prefixHit = counter("mlxserving.prefix_cache.hits", "Prompt tokens found in the prefix cache (vLLM's prefix_cache_hits).", "{token}")
	m.embedInputs = counter("mlxserving.embeddings.inputs", "Inputs embedded, by model; cached ones included.", "{input}")
	m.embedTok = counter("mlxserving.embeddings.tokens", "Input tokens embedded, by model.", "{token}")
	m.embedTime = hist("mlxserving.embeddings.duration", "Time from an embedding request's submission to its last vector.")
	m.preemptions = counter("mlxserving.preemptions", "Sequences evicted and recomputed (preemption or a lost worker).", "{preemption}")
	bs, err := meter.Int64Histogram("mlxserving.batch.size", metric.WithDescription("Sequences per engine step."),
		metric.WithUnit("{sequence}"), metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256))
	check(err)
	m.batchSize = bs
	m.registration, err = m.registerGauges(meter, s)
	check(err)
	return m, errors.Join(errs...)
}

// registerGauges reports per-model occupancy when the exporter collects.
func (m *metrics) registerGauges(meter metric.Meter, s *Server) (metric.Registration, error) {
	running, err1 := meter.Int64ObservableGauge("mlxserving.sequences.running", metric.WithDescription("Sequences in the running batch."))
	waiting, err2 := meter.Int64ObservableGauge("mlxserving.sequences.waiting", metric.WithDescription("Requests waiting in the queue."))
	kvUsed, err3 := meter.Float64ObservableGauge("mlxserving.kv.usage", metric.WithDescription("Fraction of the KV capacity reserved by running sequences."))
	breaker, err4 := meter.Int64ObservableGauge("mlxserving.breaker.state",
		metric.WithDescription("Circuit breaker state per engine worker: 0 closed, 1 half-open, 2 open."))
	merged, err5 := meter.Int64ObservableCounter("mlxserving.merge.merged", metric.WithDescription("Requests served by joining an identical generation in flight."), metric.WithUnit("{request}"))
	cacheReq, err6 := meter.Int64ObservableCounter("mlxserving.cache.requests", metric.WithDescription("Response cache look-ups by result (hit, miss)."), metric.WithUnit("{request}"))
	evicted, err7 := meter.Int64ObservableCounter("mlxserving.cache.evictions", metric.WithDescription("Responses dropped from the cache (least recently used or expired)."), metric.WithUnit("{response}"))
	cacheBytes, err8 := meter.Int64ObservableGauge("mlxserving.cache.bytes", metric.WithDescription("Bytes of responses the cache holds."), metric.WithUnit("By"))
	resumed, err9 := meter.Int64ObservableCounter("mlxserving.sequences.resumed",
		metric.WithDescription("Resumes of streams that went on after their engine worker was lost, recomputing prompt plus delivered tokens, by cause."), metric.WithUnit("{sequence}"))
	if err := errors.Join(err1, err2, err3, err4, err5, err6, err7, err8, err9); err != nil {
		return nil, err
	}
	hit, miss, none := m.with(attribute.String("result", "hit")), m.with(attribute.String("result", "miss")), m.with()
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if s.merger != nil {
			st := s.merger.Stats()
			o.ObserveInt64(merged, int64(st.Merged), none)
			o.ObserveInt64(cacheReq, int64(st.CacheHits), hit)
			o.ObserveInt64(cacheReq, int64(st.CacheMisses), miss)
			o.ObserveInt64(evicted, int64(st.CacheEvictions), none)
			o.ObserveInt64(cacheBytes, st.CacheBytes, none)
		}
		if be, ok := s.eng.(engine.WorkerBreakers); ok {
			for _, b := range be.Breakers() {
				o.ObserveInt64(breaker, int64(b.State), m.with(attribute.String("breaker", b.Name)))
			}
		}
		for id, st := range s.Stats() {
			attrs := m.with(attribute.String("model", id))
			o.ObserveInt64(running, int64(st.Batcher.Running), attrs)
			o.ObserveInt64(waiting, int64(st.Queue.Queued), attrs)
			o.ObserveInt64(resumed, int64(st.Batcher.Resumed), m.with(attribute.String("model", id), attribute.String("cause", batcher.ResumeWorkerLost)))
			if st.Batcher.KVCapacity > 0 {
				o.ObserveFloat64(kvUsed, float64(st.Batcher.KVReserved)/float64(st.Batcher.KVCapacity), attrs)
			}
		}
		return nil
	}, running, waiting, kvUsed, breaker, merged, cacheReq, evicted, cacheBytes, resumed)
}

// attr returns the cached attribute option for a model, tier and outcome.
func (m *metrics) attr(model string, tier api.Tier, outcome string) metric.MeasurementOption {
	k := attrKey{model, tier, outcome}
	m.mu.Lock()
	defer m.mu.Unlock()
	if o, ok := m.attrs[k]; ok {
		return o
	}
	kv := []attribute.KeyValue{attribute.String("model", model)}
	if tier.Valid() {
		kv = append(kv, attribute.String("tier", tier.String()))
	}
	if outcome != "" {
		kv = append(kv, attribute.String("outcome", outcome))
	}
	o := m.with(kv...)
	m.attrs[k] = o
	return o
}

// with returns the measurement option of kv and the Server's own
// attributes.
func (m *metrics) with(kv ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(append(slices.Clip(m.base), kv...)...))
}

// stepObserver records a model's engine steps.
func (m *metrics) stepObserver(model string) func(batcher.StepStats) {
	attrs := m.attr(model, 0, "")
	return func(st batcher.StepStats) {
		ctx := context.Background()
		m.batchSize.Record(ctx, int64(st.Batch), attrs)
		m.stepLatency.Record(ctx, st.Latency.Seconds(), attrs)
		if st.Between > 0 {
			m.stepBetween.Record(ctx, st.Between.Seconds(), attrs)
		}
	}
}

// resumeObserver records a model's resumed sequences.
func (m *metrics) resumeObserver(model string) func(batcher.ResumeStats) {
	return func(r batcher.ResumeStats) {
		m.resumeGap.Record(context.Background(), r.Gap.Seconds(), m.with(attribute.String("model", model), attribute.String("cause", r.Cause)))
	}
}

// refused records a request turned away before it was queued, under its
// retry.Classify outcome.
func (m *metrics) refused(model string, tier api.Tier, err error) {
	m.requests.Add(context.Background(), 1, m.attr(model, tier, outcome(err)))
}

// outcome is err's metrics outcome, retry.Classify's.
func outcome(err error) string { return retry.Classify(err).Outcome() }

// embedded records an embedding request: under mlxserving.requests with
// its outcome, and when it succeeded its inputs, tokens and duration.
func (m *metrics) embedded(model string, tier api.Tier, res *api.Embeddings, err error) {
	ctx := context.Background()
	m.requests.Add(ctx, 1, m.attr(model, tier, outcome(err)))
	if res == nil {
		return
	}
	byModel := m.attr(model, 0, "")
	m.embedInputs.Add(ctx, int64(len(res.Vectors)), byModel)
	m.embedTok.Add(ctx, int64(res.PromptTokens), byModel)
	m.embedTime.Record(ctx, res.Duration.Seconds(), m.attr(model, tier, ""))
}

// interToken records the gap between two tokens of one stream.
func (m *metrics) interToken(model string, gap time.Duration) {
	m.itl.Record(context.Background(), gap.Seconds(), m.attr(model, 0, ""))
}

// finished records a stream's end: its usage when it completed, its outcome
// either way.
func (m *metrics) finished(model string, tier api.Tier, u *api.Usage, err error) {
	ctx := context.Background()
	m.requests.Add(ctx, 1, m.attr(model, tier, outcome(err)))
	if u == nil {
		return
	}
	byModel, byTier := m.attr(model, 0, ""), m.attr(model, tier, "")
	m.duration.Record(ctx, u.Duration.Seconds(), byTier)
	m.queueWait.Record(ctx, u.QueueWait.Seconds(), byTier)
	if u.TimeToFirstToken > 0 {
		m.ttft.Record(ctx, u.TimeToFirstToken.Seconds(), byTier)
	}
	m.promptTok.Add(ctx, int64(u.PromptTokens), byModel)
	m.genTok.Add(ctx, int64(u.CompletionTokens), byModel)
	m.prefixQuery.Add(ctx, int64(u.PromptTokens), byModel)
	m.prefixHit.Add(ctx, int64(u.CachedTokens), byModel)
	if u.CachedTokens > 0 {
		m.cachedTok.Add(ctx, int64(u.CachedTokens), byModel)
	}
	if u.Preemptions > 0 {
		m.preemptions.Add(ctx, int64(u.Preemptions), byModel)
	}
}

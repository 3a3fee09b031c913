package mlxserving_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/merge"
	"github.com/mlxserving/mlxserving/retry"
)

// startAll starts n copies of r at once and returns their streams.
func startAll(t *testing.T, srv *mlxserving.Server, r api.Request, n int) []*api.Stream {
	t.Helper()
	streams := make([]*api.Stream, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			streams[i], errs[i] = srv.Generate(context.Background(), r)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	return streams
}

// TestMergeCoalesces: 64 identical greedy requests cost one generation
// (the engine samples one request's tokens) and every subscriber gets the
// whole, identical text.
func TestMergeCoalesces(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithStepTime(3*time.Millisecond, 0)}, mlxserving.WithMerging())
	const n, maxTokens = 64, 60
	streams := startAll(t, f.srv, req(maxTokens, 5, 6, 7, 8), n)
	results := make([]api.Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, st := range streams {
		wg.Add(1)
		go func() { defer wg.Done(); results[i], errs[i] = st.Collect() }()
	}
	wg.Wait()
	outcomes := map[string]int{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("subscriber %d: %v", i, errs[i])
		}
		if len(results[i].Tokens) != maxTokens || !slices.Equal(results[i].Tokens, results[0].Tokens) || results[i].Text != results[0].Text {
			t.Fatalf("subscriber %d got %d tokens, not subscriber 0's %d", i, len(results[i].Tokens), len(results[0].Tokens))
		}
		outcomes[streams[i].Header().Cache]++
	}
	if outcomes["miss"] != 1 || outcomes["merged"] != n-1 {
		t.Errorf("outcomes %v, want 1 miss and %d merged", outcomes, n-1)
	}
	if s := f.sim.Stats(); s.Sampled != maxTokens {
		t.Errorf("engine sampled %d tokens for %d identical requests, want %d (one generation)", s.Sampled, n, maxTokens)
	}
	if st := f.srv.MergeStats(); st.Merged != n-1 || st.Misses != 1 || st.InFlight != 0 {
		t.Errorf("merge stats %+v", st)
	}
	waitIdle(t, f.srv)
}

// waitIdle waits until the model manager counts no request on "sim":
// merged requests and cache hits must not keep a model busy.
func waitIdle(t *testing.T, srv *mlxserving.Server) {
	t.Helper()
	waitFor(t, "the model idle", func() bool {
		for _, st := range srv.ModelStatus() {
			if st.ID == "sim" && st.Busy {
				return false
			}
		}
		return true
	})
}

// TestMergeLateSubscriberAndCancellation: a late subscriber first gets
// every chunk produced so far; a subscriber leaving does not disturb the
// others; the generation stops when the last one leaves.
func TestMergeLateSubscriberAndCancellation(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithStepTime(2*time.Millisecond, 0)}, mlxserving.WithMerging())
	r := req(200, 9, 8, 7)
	a, err := f.srv.Generate(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	var first []int32
	for len(first) < 10 {
		c, err := a.Recv()
		if err != nil {
			t.Fatal(err)
		}
		first = append(first, c.Token)
	}
	b, err := f.srv.Generate(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancelC := context.WithCancel(context.Background())
	c, err := f.srv.Generate(cctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if b.Header().Cache != "merged" || c.Header().Cache != "merged" {
		t.Fatalf("late subscribers: %q %q, want merged", b.Header().Cache, c.Header().Cache)
	}
	var late []int32
	for len(late) < 20 {
		ch, err := b.Recv()
		if err != nil {
			t.Fatal(err)
		}
		late = append(late, ch.Token)
	}
	if !slices.Equal(late[:10], first) {
		t.Fatalf("late subscriber starts with %v, want %v", late[:10], first)
	}
	cancelC() // c leaves by its context without reading
	b.Close() // b leaves by Close
	rest, err := a.Collect()
	if err != nil {
		t.Fatalf("the remaining subscriber: %v", err)
	}
	if got := len(first) + len(rest.Tokens); got != 200 {
		t.Fatalf("remaining subscriber got %d tokens, want 200", got)
	}
	if _, err := c.Recv(); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled subscriber: %v", err)
	}

	// Everyone leaves: the generation stops early and frees its KV.
	x, err := f.srv.Generate(context.Background(), req(240, 1, 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	y, err := f.srv.Generate(context.Background(), req(240, 1, 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.Recv(); err != nil {
		t.Fatal(err)
	}
	x.Close()
	y.Close()
	waitFor(t, "the generation to stop", func() bool {
		return f.sim.Stats().OpenSequences == 0 && f.srv.MergeStats().InFlight == 0
	})
	if s := f.sim.Stats(); s.Sampled > 200+120 {
		t.Errorf("abandoned generation kept running: %d tokens sampled", s.Sampled)
	}
}

// TestMergeOnlyDeterministic: sampling without a seed is never merged or
// cached; a seeded request is.
func TestMergeOnlyDeterministic(t *testing.T) {
	f := newFixture(t, nil, mlxserving.WithMerging(merge.WithCache(1<<20, time.Minute)))
	random := req(20, 3, 4)
	random.Sampling = engine.SamplingParams{Temperature: 0.8}
	random.Cache = true
	seeded := random
	seeded.Sampling.Seed, seeded.Sampling.HasSeed = 7, true
	for _, tc := range []struct {
		name string
		r    api.Request
		want []string
	}{
		{"unseeded", random, []string{"", ""}},
		{"seeded", seeded, []string{"miss", "hit"}},
	} {
		for i, want := range tc.want {
			st, err := f.srv.Generate(context.Background(), tc.r)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.Collect(); err != nil {
				t.Fatal(err)
			}
			if got := st.Header().Cache; got != want {
				t.Errorf("%s request %d: X-Cache %q, want %q", tc.name, i, got, want)
			}
		}
	}
}

// TestResponseCache: an opted-in response is replayed without touching the
// engine; one not opted in is not; a new load of the model id misses.
func TestResponseCache(t *testing.T) {
	f := newFixture(t, nil, mlxserving.WithMerging(merge.WithCache(1<<20, time.Minute)))
	r := req(30, 11, 12, 13)
	r.Cache = true
	run := func(r api.Request) (api.Result, string) {
		t.Helper()
		st, err := f.srv.Generate(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		res, err := st.Collect()
		if err != nil {
			t.Fatal(err)
		}
		return res, st.Header().Cache
	}
	want, outcome := run(r)
	if outcome != "miss" {
		t.Fatalf("first: %q", outcome)
	}
	before := f.sim.Stats().Sampled
	got, outcome := run(r)
	if outcome != "hit" || !slices.Equal(got.Tokens, want.Tokens) || got.Text != want.Text || got.Finish != want.Finish {
		t.Fatalf("second: %q %v, want a hit with %v", outcome, got.Tokens, want.Tokens)
	}
	if got.Usage.PromptTokens != 3 || got.Usage.CompletionTokens != 30 {
		t.Errorf("hit usage %+v", got.Usage)
	}
	if s := f.sim.Stats().Sampled; s != before {
		t.Errorf("a cache hit ran the engine: %d tokens sampled", s-before)
	}
	plain := r
	plain.Cache = false
	if _, outcome := run(plain); outcome != "miss" {
		t.Errorf("not opted in: %q, want a miss", outcome)
	}
	ctx := context.Background()
	if err := f.srv.UnloadModel(ctx, "sim"); err != nil {
		t.Fatal(err)
	}
	if err := f.srv.LoadModel(ctx, engine.ModelSpec{ID: "sim"}); err != nil {
		t.Fatal(err)
	}
	if _, outcome := run(r); outcome != "miss" {
		t.Errorf("after reloading the model: %q, want a miss", outcome)
	}
	if st := f.srv.MergeStats(); st.CacheHits != 1 || st.CacheMisses != 2 || st.CacheEntries != 2 || st.CacheBytes <= 0 {
		t.Errorf("stats %+v", st)
	}
	waitIdle(t, f.srv)
}

// TestMergeFailureReachesAll: the shared generation's failure reaches
// every subscriber as the same typed error.
func TestMergeFailureReachesAll(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithStepTime(5*time.Millisecond, 0)},
		mlxserving.WithMerging(), mlxserving.WithDeadlines(retry.Deadlines{Total: 60 * time.Millisecond}))
	streams := startAll(t, f.srv, req(200, 2, 4, 6), 4)
	for i, st := range streams {
		_, err := st.Collect()
		var de *retry.DeadlineError
		if !errors.As(err, &de) || de.Kind != retry.Total {
			t.Errorf("subscriber %d: %v, want the total deadline", i, err)
		}
	}
}

// TestMergePanickingReader: a subscriber whose reader panics and never
// closes cannot stop the generation for the others.
func TestMergePanickingReader(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithStepTime(time.Millisecond, 0)}, mlxserving.WithMerging())
	streams := startAll(t, f.srv, req(80, 6, 6, 6), 3)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { _ = recover() }()
		if _, err := streams[0].Recv(); err == nil {
			panic("reader bug")
		}
	}()
	<-done
	for i, st := range streams[1:] {
		res, err := st.Collect()
		if err != nil || len(res.Tokens) != 80 {
			t.Errorf("subscriber %d: %d tokens, %v", i+1, len(res.Tokens), err)
		}
	}
	streams[0].Close()
}

// TestMergeRaisesPriority: a critical request joining a queued low-tier
// generation moves it ahead of a normal one queued before.
func TestMergeRaisesPriority(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithStepTime(time.Millisecond, 0), enginetest.WithMaxBatch(1)}, mlxserving.WithMerging())
	ctx := context.Background()
	busy, err := f.srv.Generate(ctx, req(220, 1, 2)) // holds the batch of one ~220 ms
	if err != nil {
		t.Fatal(err)
	}
	if _, err := busy.Recv(); err != nil { // running: the batch of one is full
		t.Fatal(err)
	}
	low := req(5, 3, 3)
	low.Priority = api.Low
	normal := req(5, 4, 4)
	lowSt, err := f.srv.Generate(ctx, low)
	if err != nil {
		t.Fatal(err)
	}
	normalSt, err := f.srv.Generate(ctx, normal)
	if err != nil {
		t.Fatal(err)
	}
	crit := low
	crit.Priority = api.Critical
	critSt, err := f.srv.Generate(ctx, crit)
	if err != nil {
		t.Fatal(err)
	}
	if critSt.Header().Cache != "merged" {
		t.Fatalf("critical copy: %q", critSt.Header().Cache)
	}
	finished := make(chan string, 2)
	go func() { _, _ = lowSt.Collect(); finished <- "merged" }()
	go func() { _, _ = normalSt.Collect(); finished <- "normal" }()
	if _, err := critSt.Collect(); err != nil {
		t.Fatal(err)
	}
	if first := <-finished; first != "merged" {
		t.Errorf("%s finished first; the raised generation should run before the normal one", first)
	}
	<-finished
	busy.Close()
}

// lossyEngine is the simulated engine whose models lose their worker on
// chosen steps, as a crashed process would.
type lossyEngine struct {
	*enginetest.Sim
	failAt map[int64]bool
}

func (e *lossyEngine) Load(ctx context.Context, spec engine.ModelSpec) (engine.Model, error) {
	m, err := e.Sim.Load(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &lossyModel{Model: m, failAt: e.failAt}, nil
}

type lossyModel struct {
	engine.Model
	failAt map[int64]bool
	steps  int64 // Step is serialised by the batcher
}

func (m *lossyModel) Step(ctx context.Context, in []engine.StepInput) ([]engine.StepOutput, error) {
	m.steps++
	if m.failAt[m.steps] {
		return nil, fmt.Errorf("worker 0 exited: %w", engine.ErrWorkerLost)
	}
	return m.Model.Step(ctx, in)
}

// TestMergedGenerationRetriedOnceForAll: a shared generation that loses
// its worker before its first token is retried once, for every
// subscriber, and all get the text an undisturbed run gives.
func TestMergedGenerationRetriedOnceForAll(t *testing.T) {
	ref := newFixture(t, nil)
	want, ok := generate(t, ref.srv, req(20, 7, 7, 7))
	if !ok {
		t.FailNow()
	}
	sim, err := enginetest.NewSim(enginetest.WithContextLength(256), enginetest.WithVocabSize(1000), enginetest.WithStepTime(2*time.Millisecond, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	srv, err := mlxserving.New(&lossyEngine{Sim: sim, failAt: map[int64]bool{1: true}}, mlxserving.WithMerging())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "sim"}); err != nil {
		t.Fatal(err)
	}
	for i, st := range startAll(t, srv, req(20, 7, 7, 7), 8) {
		res, err := st.Collect()
		if err != nil || !slices.Equal(res.Tokens, want.Tokens) || res.Usage.Preemptions != 1 {
			t.Errorf("subscriber %d: %v %v (preemptions %d), want %v after one retry", i, err, res.Tokens, res.Usage.Preemptions, want.Tokens)
		}
	}
	if s := sim.Stats(); s.Sampled != 20 {
		t.Errorf("engine sampled %d tokens, want 20: one generation, retried once", s.Sampled)
	}
}

// TestMergeMetrics: merged requests and cache results are exported.
func TestMergeMetrics(t *testing.T) {
	mp := newTestMeter(t)
	f := newFixture(t, []enginetest.SimOption{enginetest.WithStepTime(2*time.Millisecond, 0)},
		mlxserving.WithMeterProvider(mp), mlxserving.WithMerging(merge.WithCache(1<<20, time.Minute)))
	r := req(20, 4, 5, 6)
	r.Cache = true
	for _, st := range startAll(t, f.srv, r, 3) {
		if _, err := st.Collect(); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := generate(t, f.srv, r); !ok { // a hit
		t.FailNow()
	}
	got := map[string]int64{}
	for _, m := range mp.metrics(t) {
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, p := range d.DataPoints {
				name := m.Name
				if v, ok := p.Attributes.Value("result"); ok {
					name += "." + v.AsString()
				}
				got[name] += p.Value
			}
		case metricdata.Gauge[int64]:
			for _, p := range d.DataPoints {
				got[m.Name] += p.Value
			}
		}
	}
	if got["mlxserving.merge.merged"] < 1 || got["mlxserving.cache.requests.hit"] != 1 || got["mlxserving.cache.requests.miss"] != 3 || got["mlxserving.cache.bytes"] <= 0 {
		t.Errorf("merge metrics: %v", got)
	}
}

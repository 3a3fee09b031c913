package balancer_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/balancer"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// Figures in BENCHMARKS.md ("Load balancing"):
//
//	go test -run XXX -bench 'Balancer' -benchtime 1x ./balancer

// drive runs streams concurrent request loops for d against b and returns
// the tokens generated, the requests that failed before their first token
// and those that failed after it, the completed requests' latencies and
// the gaps that resumes added to them (Usage.ResumeGap).
func drive(b balancer.Backend, streams, tokens int, d time.Duration, session func(i int) string) (tok, failedBefore, failedAfter int64, lat, gaps []time.Duration) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	stop := time.Now().Add(d)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; time.Now().Before(stop); n++ {
				req := request("m", tokens)
				req.PromptTokens = []int32{int32(i), int32(n % 7), 3, 4}
				if session != nil {
					req.Session = session(i)
				}
				began := time.Now()
				st, err := b.Generate(context.Background(), req)
				if err != nil {
					atomic.AddInt64(&failedBefore, 1)
					continue
				}
				got := 0
				for c, err := range st.Chunks() {
					if err != nil {
						if got == 0 {
							atomic.AddInt64(&failedBefore, 1)
						} else {
							atomic.AddInt64(&failedAfter, 1)
						}
						break
					}
					if c.HasToken {
						got++
					}
					if c.Usage != nil && c.Usage.Resumes > 0 {
						mu.Lock()
						gaps = append(gaps, c.Usage.ResumeGap)
						mu.Unlock()
					}
				}
				atomic.AddInt64(&tok, int64(got))
				mu.Lock()
				lat = append(lat, time.Since(began))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return tok, failedBefore, failedAfter, lat, gaps
}

func benchInstance(b *testing.B, step time.Duration, maxBatch int) (*mlxserving.Server, func()) {
	eng, err := enginetest.NewSim(enginetest.WithStepTime(step, 0), enginetest.WithMaxBatch(maxBatch), enginetest.WithPrefixCacheEntries(256))
	if err != nil {
		b.Fatal(err)
	}
	srv, err := mlxserving.New(eng)
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.LoadModel(context.Background(), engine.ModelSpec{ID: "m"}); err != nil {
		b.Fatal(err)
	}
	return srv, func() { _ = srv.Close(); _ = eng.Close() }
}

// BenchmarkBalancerScaling: 3 instances behind a balancer against 1, the
// simulated engine at 10 ms per step and max batch 8, 48 streams of 16
// tokens (enough to saturate three instances).
func BenchmarkBalancerScaling(b *testing.B) {
	const streams, tokens, dur = 48, 16, 3 * time.Second
	rate := func(n int) float64 {
		lb, _ := balancer.New(balancer.WithStrategy(balancer.LeastLoaded()))
		defer lb.Close()
		for i := range n {
			srv, stop := benchInstance(b, 10*time.Millisecond, 8)
			defer stop()
			_ = lb.Add(fmt.Sprintf("i%d", i), srv)
		}
		began := time.Now()
		tok, _, _, _, _ := drive(lb, streams, tokens, dur, nil)
		// Requests in flight at the end finish: count their time too.
		return float64(tok) / time.Since(began).Seconds()
	}
	for b.Loop() {
		one, three := rate(1), rate(3)
		b.ReportMetric(one, "tok/s-1-instance")
		b.ReportMetric(three, "tok/s-3-instances")
		b.ReportMetric(three/one, "speedup")
	}
}

// BenchmarkBalancerOverhead: the balancer's own cost per request, against
// calling the Server directly (zero-time steps, 1-token requests).
func BenchmarkBalancerOverhead(b *testing.B) {
	srv, stop := benchInstance(b, 0, 64)
	defer stop()
	lb, _ := balancer.New()
	defer lb.Close()
	for i := range 3 {
		_ = lb.Add(fmt.Sprintf("i%d", i), srv)
	}
	run := func(b *testing.B, be balancer.Backend) {
		req := request("m", 1)
		req.Prompt = "You are a helpful assistant. Answer briefly and precisely, please. What is the capital of France?"
		for b.Loop() {
			st, err := be.Generate(context.Background(), req)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := st.Collect(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("direct", func(b *testing.B) { run(b, srv) })
	b.Run("balanced", func(b *testing.B) { run(b, lb) })
}

// BenchmarkBalancerKill: 3 instances under steady load (24 streams); one
// is closed (as a killed process refuses and drops everything) a second
// in. Requests that had not streamed a token must all succeed elsewhere;
// those that had resume on another instance (resumed, and the gap the
// resume added, p50 and p99): none may fail.
func BenchmarkBalancerKill(b *testing.B) {
	for b.Loop() {
		lb, _ := balancer.New(balancer.WithStrategy(balancer.RoundRobin()))
		var victim *mlxserving.Server
		for i := range 3 {
			srv, stop := benchInstance(b, 5*time.Millisecond, 16)
			defer stop()
			if i == 0 {
				victim = srv
			}
			_ = lb.Add(fmt.Sprintf("i%d", i), srv)
		}
		time.AfterFunc(time.Second, func() { _ = victim.Close() })
		tok, before, after, lat, gaps := drive(lb, 24, 32, 3*time.Second, nil)
		b.ReportMetric(float64(len(lat)), "completed")
		b.ReportMetric(float64(before), "failed-before-first-token")
		b.ReportMetric(float64(after), "failed-mid-stream")
		b.ReportMetric(float64(lb.Stats().Failovers), "failovers")
		b.ReportMetric(float64(lb.Stats().Resumed), "resumed")
		slices.Sort(gaps)
		if len(gaps) > 0 {
			b.ReportMetric(float64(gaps[len(gaps)/2].Microseconds())/1e3, "gap-p50-ms")
			b.ReportMetric(float64(gaps[min(len(gaps)-1, len(gaps)*99/100)].Microseconds())/1e3, "gap-p99-ms")
		}
		if before+after > 0 {
			b.Errorf("%d requests failed before their first token, %d after", before, after)
		}
		b.ReportMetric(float64(tok)/3, "tok/s")
		_ = lb.Close()
	}
}

// BenchmarkBalancerSlowBackend: 3 instances, one 5x slower (10 ms vs 2 ms
// steps); p99 request latency under each strategy, 24 streams of 16
// tokens.
func BenchmarkBalancerSlowBackend(b *testing.B) {
	strategies := []struct {
		name string
		s    func() balancer.Strategy
	}{
		{"round-robin", balancer.RoundRobin},
		{"least-loaded", balancer.LeastLoaded},
		{"p2c", func() balancer.Strategy { return balancer.PowerOfTwo(nil) }},
		{"peak-ewma", balancer.PeakEWMA},
		{"weighted", func() balancer.Strategy { return balancer.Weighted(balancer.DefaultWeights) }},
	}
	for _, s := range strategies {
		b.Run(s.name, func(b *testing.B) {
			for b.Loop() {
				lb, _ := balancer.New(balancer.WithStrategy(s.s()))
				for i, step := range []time.Duration{10 * time.Millisecond, 2 * time.Millisecond, 2 * time.Millisecond} {
					srv, stop := benchInstance(b, step, 8)
					defer stop()
					_ = lb.Add(fmt.Sprintf("i%d", i), srv)
				}
				_, _, _, lat, _ := drive(lb, 24, 16, 3*time.Second, nil)
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
				_ = lb.Close()
			}
		})
	}
}

// BenchmarkBalancerSessionReuse: 24 conversations of 6 turns over 3
// instances whose engines keep each session's KV; the fraction of prompt
// tokens reused from a session's saved KV, with session affinity and with
// round robin.
func BenchmarkBalancerSessionReuse(b *testing.B) {
	for _, aff := range []bool{false, true} {
		name := map[bool]string{false: "round-robin", true: "session-affinity"}[aff]
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				strat := balancer.RoundRobin()
				if aff {
					strat = balancer.SessionAffinity(0, balancer.RoundRobin())
				}
				lb, _ := balancer.New(balancer.WithStrategy(strat))
				for i := range 3 {
					srv, stop := benchInstance(b, 0, 32)
					defer stop()
					_ = lb.Add(fmt.Sprintf("i%d", i), srv)
				}
				var cached, prompt atomic.Int64
				var wg sync.WaitGroup
				for c := range 24 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						var history []int32
						for turn := range 6 {
							history = append(history, int32(c+1), int32(turn+1), 7, 8, 9, 10, 11, 12)
							req := api.Request{Model: "m", PromptTokens: slices.Clone(history),
								Params: api.Params{MaxTokens: 4, IgnoreEOS: true, Session: fmt.Sprintf("conv-%d", c)}}
							st, err := lb.Generate(context.Background(), req)
							if err != nil {
								b.Error(err)
								return
							}
							res, err := st.Collect()
							if err != nil {
								b.Error(err)
								return
							}
							history = append(history, res.Tokens...)
							if turn > 0 {
								cached.Add(int64(res.Usage.CachedTokens))
								prompt.Add(int64(res.Usage.PromptTokens))
							}
						}
					}()
				}
				wg.Wait()
				b.ReportMetric(float64(cached.Load())/float64(prompt.Load()), "later-turn-reuse")
				_ = lb.Close()
			}
		})
	}
}

package pyproc

import (
	"context"
	"errors"
	"flag"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
)

var (
	faultRunFor   = flag.Duration("faultrun.for", 30*time.Second, "BenchmarkKillUnderLoad: how long to run")
	faultRunEvery = flag.Duration("faultrun.every", 3*time.Second, "BenchmarkKillUnderLoad: time between kills")
)

// BenchmarkKillUnderLoad runs 32 concurrent greedy streams against a
// Server on two real Python workers and SIGKILLs the busiest worker every
// few seconds. It reports the requests that completed (and of those, the
// ones retried after losing their worker before their first token), the
// ones that failed after tokens had reached the caller (each with a
// *retry.InterruptedError), and any other failure, which must be none.
// Run it alone: -run '^$' -bench KillUnderLoad -benchtime 1x.
func BenchmarkKillUnderLoad(b *testing.B) {
	const streams, maxTokens = 32, 24
	e := newEngine(b, WithWorkers(2), WithHeartbeat(200*time.Millisecond, 5*time.Second))
	srv, err := mlxserving.New(e)
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	if err := srv.LoadModel(ctx, engine.ModelSpec{ID: "tiny", Path: tiny(b)}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		var completed, retried, interrupted, other, kills atomic.Int64
		var mu sync.Mutex
		var others []error
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for c := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					st, err := srv.Generate(ctx, api.Request{Model: "tiny", PromptTokens: prompt(c*1000+i, 6+i%9),
						Params: api.Params{MaxTokens: maxTokens, IgnoreEOS: true}})
					if err == nil {
						var res api.Result
						res, err = st.Collect()
						if err == nil {
							completed.Add(1)
							if res.Usage.Preemptions > 0 {
								retried.Add(1)
							}
							continue
						}
					}
					var ie *retry.InterruptedError
					if errors.As(err, &ie) && ie.Delivered > 0 {
						interrupted.Add(1)
						continue
					}
					other.Add(1)
					mu.Lock()
					others = append(others, err)
					mu.Unlock()
				}
			}()
		}
		deadline := time.After(*faultRunFor)
		tick := time.NewTicker(*faultRunEvery)
	run:
		for {
			select {
			case <-deadline:
				break run
			case <-tick.C:
				victim := WorkerInfo{}
				for _, w := range e.Workers() {
					if w.PID != 0 && w.Sequences >= victim.Sequences {
						victim = w
					}
				}
				if victim.PID != 0 && syscall.Kill(victim.PID, syscall.SIGKILL) == nil {
					kills.Add(1)
				}
			}
		}
		tick.Stop()
		close(stop)
		wg.Wait()
		b.ReportMetric(float64(kills.Load()), "kills")
		b.ReportMetric(float64(completed.Load()), "completed")
		b.ReportMetric(float64(retried.Load()), "retried")
		b.ReportMetric(float64(interrupted.Load()), "failed_after_tokens")
		b.ReportMetric(float64(other.Load()), "failed_other")
		for i, err := range others {
			if i < 5 {
				b.Errorf("a request failed without having streamed a token: %v", err)
			}
		}
	}
}

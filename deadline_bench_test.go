package mlxserving_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/retry"
)

// BenchmarkDeadlineLateness: 16 requests with a 30ms first-token deadline
// arrive while 200ms steps (cold prefills) run; it reports how late their
// answers come, answer time minus deadline, p50 and p99 in ms.
//
//	go test -run '^$' -bench DeadlineLateness -benchtime 5x .
func BenchmarkDeadlineLateness(b *testing.B) {
	const deadline = 30 * time.Millisecond
	f := newFixture(b, []enginetest.SimOption{enginetest.WithStepTime(200*time.Millisecond, 0)})
	var late []time.Duration
	for b.Loop() {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := req(4, 1, 2, int32(3+i))
				r.Deadlines = retry.Deadlines{FirstToken: deadline}
				start := time.Now()
				st, err := f.srv.Generate(context.Background(), r)
				if err != nil {
					b.Error(err)
					return
				}
				if _, err := st.Recv(); err == nil {
					return // made it in time
				}
				mu.Lock()
				late = append(late, time.Since(start)-deadline)
				mu.Unlock()
			}()
		}
		wg.Wait()
	}
	if len(late) == 0 {
		b.Fatal("no request missed its deadline")
	}
	slices.Sort(late)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(late[len(late)/2]), "p50-late-ms")
	b.ReportMetric(ms(late[len(late)*99/100]), "p99-late-ms")
}

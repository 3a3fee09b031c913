package prewarm_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/prewarm"
	"github.com/mlxserving/mlxserving/retry"
)

// flakyTarget loses its worker on the first fails warm-ups and records
// when each warm-up began.
type flakyTarget struct {
	fails int

	mu    sync.Mutex
	warms []time.Time
}

func (f *flakyTarget) Preload(context.Context, prewarm.Model) error { return nil }
func (f *flakyTarget) UnloadModel(context.Context, string) error    { return nil }
func (f *flakyTarget) WarmModel(context.Context, string, []string) (prewarm.WarmReport, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.warms = append(f.warms, time.Now())
	if len(f.warms) <= f.fails {
		return prewarm.WarmReport{}, fmt.Errorf("warm: %w", engine.ErrWorkerLost)
	}
	return prewarm.WarmReport{}, nil
}

// TestWarmRetryBacksOff: a warm-up that lost its worker is retried after
// retry's backoff, not at once (it once retried with no wait), and not
// after an error retry does not retry.
func TestWarmRetryBacksOff(t *testing.T) {
	f := &flakyTarget{fails: 2}
	p, err := prewarm.New(f, []prewarm.Model{simModel("a")}, prewarm.WithWarmRetries(2))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.warms) != 3 {
		t.Fatalf("%d warm-ups, want 3", len(f.warms))
	}
	// The first wait is retry.DefaultInitial less at most its jitter.
	least := time.Duration(float64(retry.DefaultInitial) * (1 - retry.DefaultJitter))
	for i := 1; i < len(f.warms); i++ {
		if gap := f.warms[i].Sub(f.warms[i-1]); gap < least {
			t.Errorf("warm-up %d came %v after the one before; the backoff is at least %v", i+1, gap, least)
		}
	}
	if st := p.Status(); len(st.Models) != 1 || st.Models[0].Attempts != 3 {
		t.Errorf("status %+v", st)
	}
}

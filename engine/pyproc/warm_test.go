package pyproc

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/retry"
	"github.com/mlxserving/mlxserving/testmodel"
)

func TestInfoReportsMemory(t *testing.T) {
	e := newEngine(t, WithWorkers(2))
	m, err := e.Load(context.Background(), engine.ModelSpec{ID: "tiny", Path: tiny(t), KVCapacity: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c := testmodel.Tiny()
	hd := c.Hidden / c.Heads
	// Weights: embed + lm_head + norm, per layer q,k,v,o, gate,up,down, two
	// norms; float32; one copy per worker.
	perLayer := c.Hidden*(c.Heads*hd) + 2*c.Hidden*(c.KVHeads*hd) + c.Hidden*c.Heads*hd + 3*c.Hidden*c.Intermediate + 2*c.Hidden
	params := 2*c.Vocab*c.Hidden + c.Hidden + c.Layers*perLayer
	info := m.Info()
	if want := int64(2 * 4 * params); info.WeightBytes != want {
		t.Errorf("WeightBytes = %d, want %d", info.WeightBytes, want)
	}
	// KV: each worker holds a pool of 512 tokens in blocks of 16, plus a
	// scratch block, of K and V per layer.
	if info.BlockSize != 16 || info.KVBlocks != 64 || info.KVCapacity != 1024 {
		t.Errorf("BlockSize %d, KVBlocks %d, KVCapacity %d; want 16, 64 (32 per worker), 1024", info.BlockSize, info.KVBlocks, info.KVCapacity)
	}
	if want := int64(2 * 2 * c.Layers * (32 + 1) * 16 * c.KVHeads * hd * 4); info.KVBytes != want {
		t.Errorf("KVBytes = %d, want %d: 33 blocks of K and V on each of 2 workers", info.KVBytes, want)
	}
}

func TestWarm(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tiny(t))
	defer m.Close()
	before := generate(t, m, 1, prompt(1, 9), 6)
	sizes, err := m.Warm(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{1, 2, 4, 8, 16, 24, 32, 48, 64}; !slices.Equal(sizes, want) {
		t.Fatalf("warmed %v, want %v (max batch 64)", sizes, want)
	}
	// Warm used scratch KV only: the same prompt gives the same tokens and
	// every KV slot is free again.
	if after := generate(t, m, 2, prompt(1, 9), 6); !slices.Equal(before, after) {
		t.Fatalf("tokens changed after Warm: %v, then %v", before, after)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Warm(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Warm with a cancelled context: %v", err)
	}
	_ = m.Close()
	if _, err := m.Warm(context.Background()); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("Warm after Close: %v, want ErrClosed", err)
	}
}

// TestWarmAfterWorkerLoss kills the worker as Warm starts: Warm fails with
// a retryable error (or waits for the replacement), and once the
// supervisor has restarted the worker and reloaded the model, Warm
// succeeds — what a pre-warmer's retry relies on.
func TestWarmAfterWorkerLoss(t *testing.T) {
	e := newEngine(t, withFaults())
	m := load(t, e, tiny(t))
	defer m.Close()
	inject(t, e, 0, map[string]any{"kind": "exit"})
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err = m.Warm(ctx)
		cancel()
		if err == nil {
			break
		}
		if !retry.Retryable(err) {
			t.Fatalf("attempt %d: %v, want a retryable error", attempt, err)
		}
	}
	if err != nil {
		t.Fatalf("Warm never succeeded after the worker was replaced: %v", err)
	}
	if r := e.Workers()[0].Restarts; r != 1 {
		t.Fatalf("%d restarts, want 1", r)
	}
}

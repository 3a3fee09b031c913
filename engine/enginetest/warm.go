package enginetest

import (
	"context"
	"fmt"
	"math/bits"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

var _ engine.Warmer = (*simModel)(nil)

// SimBuckets returns the batch-size buckets of a model with the given max
// batch: the powers of two below it, then maxBatch itself. A Step of n
// inputs falls in the smallest bucket of at least n.
func SimBuckets(maxBatch int) []int {
	var out []int
	for b := 1; b < maxBatch; b *= 2 {
		out = append(out, b)
	}
	return append(out, maxBatch)
}

// bucketBit is the warm bit of the bucket a batch of n inputs falls in.
func bucketBit(n, maxBatch int) uint64 {
	shift := bits.Len(uint(n - 1))
	if 1<<shift >= maxBatch || shift >= 63 {
		return 1 << 63
	}
	return 1 << shift
}

// coldCost returns the compile time a batch of n inputs pays and marks its
// bucket warm. Has to be called with m.mu held.
func (m *simModel) coldCost(n int) time.Duration {
	d := m.sim.cfg.compileTime
	bit := bucketBit(n, m.info.MaxBatch)
	if d <= 0 || m.warm&bit != 0 {
		return 0
	}
	m.warm |= bit
	m.sim.stats.cold.Add(1)
	return d
}

// Warm runs one simulated decode step at every batch-size bucket: each
// bucket not seen yet pays the compile time of [WithCompileTime], and
// every step its step time. No sequence or KV changes. It implements
// [engine.Warmer].
func (m *simModel) Warm(ctx context.Context) ([]int, error) {
	buckets := SimBuckets(m.info.MaxBatch)
	for _, b := range buckets {
		if err := m.warmOne(ctx, b); err != nil {
			return nil, err
		}
	}
	return buckets, nil
}

func (m *simModel) warmOne(ctx context.Context, n int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("enginetest: model %q: warm: %w", m.info.ID, engine.ErrClosed)
	}
	cfg := &m.sim.cfg
	if d := cfg.stepFixed + cfg.stepPerToken*time.Duration(n) + m.coldCost(n); d > 0 {
		return m.waitUntil(ctx, m.timer, time.Now().Add(d))
	}
	return nil
}

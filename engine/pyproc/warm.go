package pyproc

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/mlxserving/mlxserving/engine"
)

var _ engine.Warmer = (*Model)(nil)

// Warm asks every worker to run one decode step at each of its batch-size
// buckets on scratch KV (the torch backend captures the bucket's CUDA
// graph there when graphs are on), and returns the batch sizes warmed. A
// worker runs requests in order, so Warm is serialised with the model's
// steps on each worker and may be called while the model serves. A worker
// being restarted is waited for, within ctx.
func (m *Model) Warm(ctx context.Context) ([]int, error) {
	if err := m.usable(); err != nil {
		return nil, err
	}
	sizes := make([][]int, len(m.e.slots))
	errs := make([]error, len(m.e.slots))
	var wg sync.WaitGroup
	for i, s := range m.e.slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := s.current(ctx, m.e.closing)
			if err == nil {
				var r *reply
				if r, err = p.call(ctx, m.spec.ID, request("warm", map[string]any{"model": m.handle})); err == nil {
					sizes[i] = r.Warmed
				}
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, firstError(errs)
	}
	return slices.Clone(sizes[0]), nil
}

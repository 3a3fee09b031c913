//go:build mlx

package mlx

import (
	"context"

	"github.com/mlxserving/mlxserving/engine"
)

var _ engine.Warmer = (*model)(nil)

// Warm runs a one-token prefill and one decode step at every power-of-two
// batch size up to MaxBatch, and at MaxBatch, on scratch sequences of its
// own: MLX builds kernels (Metal shaders, CPU code, CUDA kernels) and
// grows its buffer cache the first time it meets a shape, which otherwise
// the first requests pay. Each size runs as one job on the MLX thread, so
// Warm interleaves with the caller's steps without touching their
// sequences, KV accounting or saved prefixes; see engine.Warmer.
func (m *model) Warm(ctx context.Context) ([]int, error) {
	var warmed []int
	if m.cfg.headless() { // nothing samples on it
		return warmed, nil
	}
	for _, b := range warmSizes(m.info.MaxBatch) {
		if err := ctx.Err(); err != nil {
			return warmed, err
		}
		if err := m.call(func(g *graph) error { return m.warmBatch(ctx, g, b) }); err != nil {
			return warmed, err
		}
		warmed = append(warmed, b)
	}
	return warmed, nil
}

// warmSizes is 1, 2, 4, ... below maxBatch, then maxBatch.
func warmSizes(maxBatch int) []int {
	var out []int
	for b := 1; b < maxBatch; b *= 2 {
		out = append(out, b)
	}
	return append(out, maxBatch)
}

// warmBatch steps b scratch sequences twice (a one-token prompt, then the
// token it sampled). The scratch sequences are not in m.seqs: they take
// only free pool rows, evict no saved prefix, and give their rows back
// before the job ends. MLX thread only.
func (m *model) warmBatch(ctx context.Context, g *graph, b int) error {
	greedy := &engine.SamplingParams{}
	feeds := make([]feed, b)
	params := make([]*engine.SamplingParams, b)
	first := max(m.info.BOS, 0)
	for i := range feeds {
		feeds[i] = feed{seq: &seqState{}, tokens: []int32{first}, sample: true}
		params[i] = greedy
	}
	defer func() {
		for _, f := range feeds {
			f.seq.free()
		}
	}()
	for range 2 {
		outs, err := m.run(ctx, g, feeds, params)
		if err != nil {
			return err
		}
		for i := range feeds {
			feeds[i].tokens = []int32{outs[i].Token}
		}
	}
	return nil
}

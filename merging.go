package mlxserving

import (
	"context"
	"errors"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/merge"
)

// WithMerging turns request merging on: identical deterministic requests
// (greedy, or sampled with a seed) in flight at the same time share one
// generation, and with merge.WithCache finished responses of requests
// that set Params.Cache are served again from memory. Requests with a
// session or their own deadlines are never merged. Streams report what
// happened in Header().Cache ("miss", "merged", "hit"; "" when the
// request was not eligible).
func WithMerging(opts ...merge.Option) Option {
	return func(c *config) error {
		c.merging, c.mergeOpts = true, opts
		return nil
	}
}

// mergeable reports whether a request may share a generation: its output
// is a function of its inputs, and it has nothing of its own that a shared
// generation would lose (a session's saved KV, its own deadlines).
func mergeable(p *api.Params) bool {
	return merge.Deterministic(p.Sampling) && p.Session == "" && p.Deadlines.Zero() && len(p.Resume) == 0
}

// join serves a mergeable request through the merger.
func (s *Server) join(ctx context.Context, m *model, prompt []int32, p api.Params, stopTokens []int32, hdr api.Header) (*api.Stream, error) {
	k := merge.KeyOf(merge.Request{Model: m.info.ID, Revision: m.revision, Prompt: prompt, MaxTokens: p.MaxTokens,
		Sampling: p.Sampling, Stop: p.Stop, StopTokens: stopTokens, IgnoreEOS: p.IgnoreEOS, JSONSchema: p.JSONSchema, KeepCut: p.KeepCut,
		Adapter: s.adapterRev(p.Adapter)})
	src, outcome, err := s.merger.Join(ctx, k, p.Priority, p.Cache, func(fctx context.Context, tier api.Tier) (api.Source, error) {
		q := p
		q.Priority = tier
		q.Session = hdr.Session // a minted session saves the generation's KV
		return s.start(fctx, m, prompt, q, stopTokens)
	})
	if errors.Is(err, merge.ErrClosed) {
		err = ErrServerClosed
	}
	if err != nil {
		return nil, err
	}
	if outcome != merge.Miss {
		// Only a miss started a sequence, which holds the model until it
		// ends; a subscriber to another's generation or a cache hit holds
		// nothing of its own.
		s.release(m)
	}
	hdr.Cache = string(outcome)
	return api.NewStream(ctx, src, hdr), nil
}

//go:build mlx

package mlx

import (
	"cmp"
	"context"
	"fmt"

	"github.com/mlxserving/mlxserving/engine"
)

// Step runs one forward pass over the batch; see engine.Model.
func (m *model) Step(ctx context.Context, batch []engine.StepInput) ([]engine.StepOutput, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(batch) == 0 {
		return nil, nil
	}
	if len(batch) > m.info.MaxBatch {
		return nil, &engine.InvalidParamError{Param: "batch", Reason: fmt.Sprintf("%d inputs; the model takes at most %d", len(batch), m.info.MaxBatch)}
	}
	params, err := m.checkParams(batch)
	if err != nil {
		return nil, err
	}
	var out []engine.StepOutput
	err = m.call(func(g *graph) error {
		feeds, ps, err := m.feeds(batch, params)
		if err != nil {
			return err
		}
		out, err = m.run(ctx, g, feeds, ps)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// checkParams validates tokens and sampling parameters; it returns each
// input's parameters, nil for those that do not sample.
func (m *model) checkParams(batch []engine.StepInput) ([]*engine.SamplingParams, error) {
	params := make([]*engine.SamplingParams, len(batch))
	greedy := &engine.SamplingParams{}
	for i, in := range batch {
		if len(in.Tokens) == 0 {
			return nil, &engine.InvalidParamError{Param: "tokens", Reason: fmt.Sprintf("sequence %d feeds no tokens", in.Seq)}
		}
		for _, t := range in.Tokens {
			if t < 0 || int(t) >= m.info.VocabSize {
				return nil, &engine.InvalidParamError{Param: "tokens", Reason: fmt.Sprintf("token %d is outside the vocabulary [0, %d)", t, m.info.VocabSize)}
			}
		}
		if !in.Sample {
			continue
		}
		p := in.Params
		if p == nil {
			p = greedy
		}
		if err := p.Validate(); err != nil {
			return nil, err
		}
		if err := p.CheckVocab(m.info.VocabSize); err != nil {
			return nil, err
		}
		if err := engine.CheckMask(in.Allowed, m.info.VocabSize); err != nil {
			return nil, err
		}
		params[i] = p
	}
	return params, nil
}

// feeds resolves the batch's sequences and returns them with the
// parameters of the feeds that sample a token, in order (an embedding
// sequence's last input samples none: it ends the input). MLX thread
// only.
func (m *model) feeds(batch []engine.StepInput, params []*engine.SamplingParams) ([]feed, []*engine.SamplingParams, error) {
	feeds := make([]feed, len(batch))
	var ps []*engine.SamplingParams
	seen := make(map[engine.SeqID]bool, len(batch))
	for i, in := range batch {
		s, ok := m.seqs[in.Seq]
		if !ok {
			return nil, nil, &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d is not open", in.Seq)}
		}
		if seen[in.Seq] {
			return nil, nil, &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d appears twice in the batch", in.Seq)}
		}
		seen[in.Seq] = true
		if n := len(s.tokens) + len(in.Tokens); n > m.info.ContextLength {
			return nil, nil, &engine.ContextLengthError{Model: m.info.ID, Prompt: n, Limit: m.info.ContextLength}
		}
		feeds[i] = feed{id: in.Seq, seq: s, tokens: in.Tokens, sample: in.Sample, allowed: in.Allowed}
		if s.embed != nil {
			if err := embedFeed(&feeds[i], false); err != nil {
				return nil, nil, err
			}
		} else if in.Sample {
			ps = append(ps, params[i])
		}
	}
	return feeds, ps, nil
}

// run builds, evaluates and reads one step. MLX thread only.
func (m *model) run(ctx context.Context, g *graph, feeds []feed, params []*engine.SamplingParams) ([]engine.StepOutput, error) {
	at := g.prims
	logits, pooled, pp := m.forwardAll(g, feeds, len(params) > 0)
	counted := make([][]int32, len(feeds)) // what this step adds to each feed's counts
	i := 0
	for j, f := range feeds {
		s := f.seq
		switch {
		case s.sampled:
			counted[j] = f.tokens
		case f.sample:
			counted[j] = s.resume(f.tokens, params[i])
		}
		s.count(counted[j], 1)
		if f.sample {
			i++
		}
	}
	// counts holds this step's tokens from here on; a failed step takes
	// them back.
	var toks, lps, topIDs, topLps arr
	if len(params) > 0 {
		toks, lps, topIDs, topLps = m.sampleAll(g, logits, feeds, params)
	}
	m.prims.Step = g.prims - at
	// Evaluate the samples and the pool together, so that a prefill chunk
	// that samples nothing still lands in the cache.
	outs := append([]arr(nil), m.pool.kv...)
	cancelled := ctx.Err()
	if len(params) > 0 && cancelled == nil {
		outs = append(outs, toks, lps)
		if !isNull(topIDs) {
			outs = append(outs, topIDs, topLps)
		}
	}
	if pp != nil && cancelled == nil {
		outs = append(outs, pooled)
	}
	g.eval(outs...)
	if err := cmp.Or(g.err, cancelled); err != nil {
		for j, f := range feeds {
			f.seq.count(counted[j], -1)
			if !f.seq.sampled {
				f.seq.drawn = 0
			}
			if f.seq.pool != nil {
				f.seq.pool.drop(f.seq, len(f.seq.tokens))
			}
		}
		return nil, err
	}
	for _, f := range feeds {
		f.seq.tokens = append(f.seq.tokens, f.tokens...)
		m.pool.settle(f.seq)
	}
	if pp != nil {
		vals, err := readFloat32s(pooled)
		if err == nil {
			err = pp.addPooled(feeds, vals, m.cfg.Hidden)
		}
		if err != nil {
			return nil, err
		}
	}
	for _, f := range feeds {
		if f.sample {
			if f.seq.sampled { // forced tokens (engine.Info.JumpForward) are generated positions
				f.seq.drawn += len(f.tokens) - 1
			}
			f.seq.sampled = true
			f.seq.drawn++
		}
	}
	return m.outputs(feeds, params, toks, lps, topIDs, topLps)
}

// resume starts a sequence's sampling state at its first sample, fed
// toks this step: with p.Generated set, its draws continue at that
// generated position and it returns the prompt's last Generated tokens
// (this step's included), which presence and frequency penalties count
// as generated (engine.SamplingParams.Generated).
func (s *seqState) resume(toks []int32, p *engine.SamplingParams) []int32 {
	all := len(s.tokens) + len(toks)
	gen := min(p.Generated, all)
	s.drawn = gen
	if gen == 0 || p.PresencePenalty == 0 && p.FrequencyPenalty == 0 {
		return nil
	}
	out := make([]int32, 0, gen)
	if from := all - gen; from < len(s.tokens) {
		out = append(out, s.tokens[from:]...)
		return append(out, toks...)
	}
	return append(out, toks[all-gen-len(s.tokens):]...)
}

// count adds d to the counts of toks.
func (s *seqState) count(toks []int32, d int) {
	if len(toks) == 0 {
		return
	}
	if s.counts == nil {
		s.counts = map[int32]int{}
	}
	for _, t := range toks {
		if s.counts[t] += d; s.counts[t] == 0 {
			delete(s.counts, t)
		}
	}
}

// outputs reads the step's samples and returns one output per feed that
// samples a token or ends an embedding input, in feed order.
func (m *model) outputs(feeds []feed, params []*engine.SamplingParams, toks, lps, topIDs, topLps arr) ([]engine.StepOutput, error) {
	if len(params) == 0 {
		return stepOutputs(feeds, nil), nil
	}
	ts, err := readInt32s(toks)
	if err != nil {
		return nil, err
	}
	ls, err := readFloat32s(lps)
	if err != nil {
		return nil, err
	}
	if len(ts) != len(ls) || len(ts) != len(params) {
		return nil, fmt.Errorf("mlx: sampled %d tokens and %d log-probabilities for %d sampling inputs", len(ts), len(ls), len(params))
	}
	var tids []int32
	var tlps []float32
	if !isNull(topIDs) {
		if tids, err = readInt32s(topIDs); err != nil {
			return nil, err
		}
		if tlps, err = readFloat32s(topLps); err != nil {
			return nil, err
		}
	}
	k := 0
	if len(ts) > 0 {
		k = len(tids) / len(ts)
	}
	return stepOutputs(feeds, func(i int) engine.StepOutput {
		o := engine.StepOutput{Token: ts[i], Logprob: ls[i]}
		for j := 0; j < min(params[i].TopLogprobs, k); j++ {
			o.Top = append(o.Top, engine.TokenLogprob{Token: tids[i*k+j], Logprob: tlps[i*k+j]})
		}
		return o
	}), nil
}

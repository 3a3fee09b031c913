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
		feeds, err := m.feeds(batch)
		if err != nil {
			return err
		}
		out, err = m.run(ctx, g, feeds, params)
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

// checkParams validates tokens and sampling parameters; it returns the
// parameters of the sampling inputs in order.
func (m *model) checkParams(batch []engine.StepInput) ([]*engine.SamplingParams, error) {
	var params []*engine.SamplingParams
	greedy := &engine.SamplingParams{}
	for _, in := range batch {
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
		params = append(params, p)
	}
	return params, nil
}

// feeds resolves the batch's sequences. MLX thread only.
func (m *model) feeds(batch []engine.StepInput) ([]feed, error) {
	feeds := make([]feed, len(batch))
	seen := make(map[engine.SeqID]bool, len(batch))
	for i, in := range batch {
		s, ok := m.seqs[in.Seq]
		if !ok {
			return nil, &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d is not open", in.Seq)}
		}
		if seen[in.Seq] {
			return nil, &engine.InvalidParamError{Param: "seq", Reason: fmt.Sprintf("sequence %d appears twice in the batch", in.Seq)}
		}
		seen[in.Seq] = true
		if n := len(s.tokens) + len(in.Tokens); n > m.info.ContextLength {
			return nil, &engine.ContextLengthError{Model: m.info.ID, Prompt: n, Limit: m.info.ContextLength}
		}
		feeds[i] = feed{id: in.Seq, seq: s, tokens: in.Tokens, sample: in.Sample, allowed: in.Allowed}
	}
	return feeds, nil
}

// run builds, evaluates and reads one step. MLX thread only.
func (m *model) run(ctx context.Context, g *graph, feeds []feed, params []*engine.SamplingParams) ([]engine.StepOutput, error) {
	at := g.prims
	logits := m.forward(g, feeds, len(params) > 0)
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
	}
	if len(params) == 0 {
		return nil, nil
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

func (m *model) outputs(feeds []feed, params []*engine.SamplingParams, toks, lps, topIDs, topLps arr) ([]engine.StepOutput, error) {
	ts, err := readInt32s(toks)
	if err != nil {
		return nil, err
	}
	ls, err := readFloat32s(lps)
	if err != nil {
		return nil, err
	}
	if len(ts) != len(ls) {
		return nil, fmt.Errorf("mlx: sampled %d tokens and %d log-probabilities", len(ts), len(ls))
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
	out := make([]engine.StepOutput, 0, len(ts))
	for _, f := range feeds {
		if f.sample {
			i := len(out)
			o := engine.StepOutput{Seq: f.id, Token: ts[i], Logprob: ls[i]}
			for j := 0; j < min(params[i].TopLogprobs, k); j++ {
				o.Top = append(o.Top, engine.TokenLogprob{Token: tids[i*k+j], Logprob: tlps[i*k+j]})
			}
			out = append(out, o)
		}
	}
	return out, nil
}

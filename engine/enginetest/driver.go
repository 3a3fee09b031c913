package enginetest

import (
	"context"
	"fmt"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/mix"
)

// plan is one sequence the driver runs: its prompt, how it is fed, and
// what it produced.
type plan struct {
	id     engine.SeqID
	prompt []int32
	n      int                    // tokens to generate
	chunk  int                    // prompt chunk size; 0 feeds the rest of the prompt whole
	start  int                    // the driver step at which the sequence opens
	params *engine.SamplingParams // nil means greedy
	key    string                 // prefix key for Open
	save   string                 // key for Free
	// adapter opens the sequence with OpenAdapter (the model must be an
	// engine.AdapterModel); empty opens it with Open.
	adapter string

	reused int     // what Open reported
	out    []int32 // generated tokens
	fed    int     // prompt tokens fed so far (reused ones count)
	open   bool
	done   bool
}

// input returns the sequence's next StepInput and advances fed.
func (p *plan) input() engine.StepInput {
	if p.fed < len(p.prompt) {
		end := len(p.prompt)
		if p.chunk > 0 {
			end = min(p.fed+p.chunk, end)
		}
		in := engine.StepInput{Seq: p.id, Tokens: p.prompt[p.fed:end], Sample: end == len(p.prompt), Params: p.params}
		p.fed = end
		return in
	}
	return engine.StepInput{Seq: p.id, Tokens: p.out[len(p.out)-1:], Sample: true, Params: p.params}
}

// maxDriverSteps bounds a drive so that an engine that stops sampling
// fails the suite instead of hanging it.
const maxDriverSteps = 10000

// drive runs plans together on m — each opening at its start step, at most
// Info().MaxBatch inputs per Step — until every one has generated n
// tokens and been freed. On error it frees what it opened.
func drive(ctx context.Context, m engine.Model, plans []*plan) error {
	info := m.Info()
	defer func() {
		for _, p := range plans {
			if p.open && !p.done {
				m.Free(p.id, "")
			}
		}
	}()
	greedy := &engine.SamplingParams{}
	for _, p := range plans {
		if p.params == nil {
			p.params = greedy
		}
	}
	for step := 0; step < maxDriverSteps; step++ {
		batch, owners, pending, err := gather(ctx, m, plans, step, max(info.MaxBatch, 1))
		if err != nil || !pending {
			return err
		}
		if len(batch) == 0 {
			continue
		}
		outs, err := m.Step(ctx, batch)
		if err != nil {
			return fmt.Errorf("step %d (%d sequences): %w", step, len(batch), err)
		}
		if err := deliver(m, info, batch, owners, outs); err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
	}
	return fmt.Errorf("sequences still unfinished after %d steps", maxDriverSteps)
}

// gather opens the plans due at step and collects one input from each
// open, unfinished plan, up to maxBatch. pending is false when every plan
// is done.
func gather(ctx context.Context, m engine.Model, plans []*plan, step, maxBatch int) (batch []engine.StepInput, owners []*plan, pending bool, err error) {
	for _, p := range plans {
		if p.done {
			continue
		}
		pending = true
		if step < p.start || len(batch) == maxBatch {
			continue
		}
		if !p.open {
			r, err := open(ctx, m, p)
			if err != nil {
				return nil, nil, true, fmt.Errorf("open sequence %d (%d prompt tokens): %w", p.id, len(p.prompt), err)
			}
			if r < 0 || r >= len(p.prompt) {
				return nil, nil, true, fmt.Errorf("open sequence %d: reused %d of %d prompt tokens; want 0 to %d", p.id, r, len(p.prompt), len(p.prompt)-1)
			}
			p.open, p.reused, p.fed = true, r, r
		}
		batch = append(batch, p.input())
		owners = append(owners, p)
	}
	return batch, owners, pending, nil
}

// open opens p's sequence, with its adapter when it has one.
func open(ctx context.Context, m engine.Model, p *plan) (int, error) {
	if p.adapter == "" {
		return m.Open(ctx, p.id, p.prompt, p.key)
	}
	am, ok := m.(engine.AdapterModel)
	if !ok {
		return 0, fmt.Errorf("sequence %d asks for adapter %q of a model that serves none", p.id, p.adapter)
	}
	return am.OpenAdapter(ctx, p.id, p.prompt, p.key, p.adapter)
}

// deliver checks a Step's outputs against its batch and hands the tokens
// to their plans, freeing the plans that are complete.
func deliver(m engine.Model, info engine.Info, batch []engine.StepInput, owners []*plan, outs []engine.StepOutput) error {
	j := 0
	for i, in := range batch {
		if !in.Sample {
			continue
		}
		if j >= len(outs) {
			return fmt.Errorf("%d outputs for a batch with more sampling inputs", len(outs))
		}
		o := outs[j]
		j++
		if o.Seq != in.Seq {
			return fmt.Errorf("output %d is for sequence %d; want %d (outputs follow input order)", j-1, o.Seq, in.Seq)
		}
		if o.Token < 0 || int(o.Token) >= info.VocabSize {
			return fmt.Errorf("sequence %d got token %d, outside the vocabulary [0, %d)", o.Seq, o.Token, info.VocabSize)
		}
		p := owners[i]
		p.out = append(p.out, o.Token)
		if len(p.out) == p.n {
			m.Free(p.id, p.save)
			p.done = true
		}
	}
	if j != len(outs) {
		return fmt.Errorf("%d outputs for %d sampling inputs", len(outs), j)
	}
	return nil
}

// promptTokens returns n deterministic token ids in [0, min(vocab, 200)),
// different for different seeds.
func promptTokens(seed, n, vocab int) []int32 {
	span := uint64(min(vocab, 200))
	x := uint64(seed)*0x9e3779b97f4a7c15 + 1
	p := make([]int32, n)
	for i := range p {
		x = mix.Mix64(x + 0x632be59bd9b4e019)
		p[i] = int32(x % span)
	}
	return p
}

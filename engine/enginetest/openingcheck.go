package enginetest

import (
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// checkPipelineOpening: a sequence's first prompt chunk sent with
// StepAsync behind its OpenAsync, marked Opening, gives the tokens a
// synchronous Open and Step of the prompt past what that Open reused
// give, and the sequence steps on with them (it holds the KV it should):
// with a prefix saved under the open's key, for a chunk within the reused
// prefix, one past it, and the whole prompt sampling, the open waited for
// while the step is pending or before it is sent; and for an open that
// reuses nothing. The synchronous runs give the reference and their
// reused counts cut the chunks, so an engine that also reuses a prefix
// of its own (an automatic prefix cache) passes. An Opening input in a
// Step, and one of a sequence stepped since its open, is an
// *engine.InvalidParamError that changes nothing. Skipped when the Open
// reuses fewer than 2 tokens of the saved prefix.
func checkPipelineOpening(tb testing.TB, s *suite) {
	p := newPipe(tb, s, s.m)
	defer p.close()
	first := &plan{id: s.id(), prompt: s.prompt(580, 10), n: 5, save: "conformance-pipeline-opening"}
	s.run(tb, s.m, first)
	keyed := &plan{id: s.id(), prompt: append(first.history(), s.prompt(581, 8)...), n: 3, key: first.save}
	unkeyed := &plan{id: s.id(), prompt: s.prompt(582, 9), n: 3}
	s.run(tb, s.m, keyed)
	s.run(tb, s.m, unkeyed)
	pe, r := keyed.prompt, keyed.reused
	if r < 2 {
		tb.Skipf("an Open of a %d-token prompt starting with the %d tokens saved under its key reused %d: no chunk to cut within it",
			len(pe), len(first.history()), r)
	}
	for _, c := range []struct {
		what     string
		ref      *plan
		chunk    int
		answered bool // the open's Wait returned before the step was sent
	}{
		{"a first chunk within the reused prefix", keyed, r / 2, false},
		{"a first chunk past the reused prefix", keyed, min(r+max(1, (len(pe)-r)/2), len(pe)), true},
		{"the whole prompt", keyed, len(pe), false},
		{"an open that reuses nothing", unkeyed, len(unkeyed.prompt) / 2, false},
	} {
		got := p.opening(c.ref.prompt, c.ref.key, c.chunk, c.ref.n, c.answered)
		if !slices.Equal(got, c.ref.out) {
			tb.Errorf("%s (%d of %d prompt tokens; a synchronous Open reused %d): tokens %v; a synchronous Open and Step of the rest give %v",
				c.what, c.chunk, len(c.ref.prompt), c.ref.reused, got, c.ref.out)
		}
	}
	p.openingRefused(keyed)
}

// opening opens a sequence for prompt with OpenAsync and sends its first
// chunk behind the open, marked Opening, waiting for the open before the
// step is sent when answered and while it is pending otherwise; it then
// feeds the rest of the prompt past what the sequence holds and steps on
// with Step until it has n tokens, and frees the sequence.
func (p *pipe) opening(prompt []int32, key string, chunk, n int, answered bool) []int32 {
	p.tb.Helper()
	id := p.s.id()
	po := p.openAsync(id, prompt, key)
	reused := 0
	waitOpen := func() {
		p.tb.Helper()
		var err error
		if reused, err = po.Wait(p.s.ctx); err != nil {
			p.tb.Fatalf("the open of a %d-token prompt an Opening chunk of %d tokens went behind: %v", len(prompt), chunk, err)
		}
	}
	if answered {
		waitOpen()
	}
	in := engine.StepInput{Seq: id, Tokens: prompt[:chunk], Sample: chunk == len(prompt), Params: &engine.SamplingParams{}, Opening: true}
	ps := p.send([]engine.StepInput{in})
	if !answered {
		waitOpen()
	}
	got := tokens(p.wait(ps, "the step of an Opening chunk"))
	if fed := max(reused, chunk); fed < len(prompt) {
		got = append(got, tokens(p.step([]engine.StepInput{sampleIn(id, prompt[fed:]...)}))...)
	}
	got = p.stepOn(id, got, n)
	p.m.Free(id, "")
	return got
}

// openingRefused: an Opening input in a Step, and one of a sequence
// stepped since its open, is refused with an *engine.InvalidParamError,
// and the sequence, opened with ref's prompt and key, goes on to ref's
// tokens.
func (p *pipe) openingRefused(ref *plan) {
	p.tb.Helper()
	id := p.s.id()
	if _, err := p.openAsync(id, ref.prompt, ref.key).Wait(p.s.ctx); err != nil {
		p.tb.Fatalf("an open with a prefix key: %v", err)
	}
	whole := engine.StepInput{Seq: id, Tokens: ref.prompt, Sample: true, Params: &engine.SamplingParams{}, Opening: true}
	if _, err := p.m.Step(p.s.ctx, []engine.StepInput{whole}); !isInvalid(err) {
		p.tb.Errorf("an Opening input in a Step: %v; want an *engine.InvalidParamError", err)
	}
	got := tokens(p.wait(p.send([]engine.StepInput{whole}), "an Opening input after its open was answered"))
	again := whole
	again.Tokens = append(slices.Clone(ref.prompt), got...)
	p.refused(nil, []engine.StepInput{again}, "an Opening input of a sequence stepped since its open")
	if got = p.stepOn(id, got, ref.n); !slices.Equal(got, ref.out) {
		p.tb.Errorf("a sequence whose Opening inputs were refused: tokens %v; a synchronous Open and Step give %v", got, ref.out)
	}
	p.m.Free(id, "")
}

// stepOn steps sequence id on from the tokens got it sampled, feeding
// each back with Step, until it has n (or a step samples none).
func (p *pipe) stepOn(id engine.SeqID, got []int32, n int) []int32 {
	p.tb.Helper()
	for len(got) > 0 && len(got) < n {
		outs := p.step([]engine.StepInput{sampleIn(id, got[len(got)-1])})
		if len(outs) == 0 {
			break
		}
		got = append(got, tokens(outs)...)
	}
	return got
}

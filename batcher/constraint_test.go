package batcher_test

import (
	"encoding/json"
	"testing"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/engine/grammar"
)

// byteVocab gives the simulated model's ids text: ids below 256 are single
// bytes, id 300 is EOS, the rest produce nothing (and are never allowed).
func byteVocab(n int) *grammar.Vocab {
	pieces := make([][]byte, n)
	for i := 0; i < 256; i++ {
		pieces[i] = []byte{byte(i)}
	}
	pieces[300] = []byte("</s>")
	return grammar.NewVocab(pieces, []int32{300}, nil)
}

// TestConstrainedSequences: sequences under a JSON-schema grammar sample
// only allowed tokens, side by side with unconstrained ones, and finish
// with "stop" once the document is complete.
func TestConstrainedSequences(t *testing.T) {
	const vocab = 512
	r := newRig(t, []enginetest.SimOption{enginetest.WithVocabSize(vocab), enginetest.WithEOS(300)}, nil)
	v := byteVocab(vocab)
	schema := `{"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer","minimum":0,"maximum":9},"tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":3}},"required":["ok","n","tags"],"additionalProperties":false}`
	g, err := v.Compile([]byte(schema), grammar.Limits{MaxWhitespace: 2})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []*batcher.Sequence
	for i := 0; i < 6; i++ {
		s := &batcher.Sequence{Prompt: prompt(i, 5), MaxTokens: 400}
		if i%2 == 0 {
			s.Constraint = g.NewMatcher()
			s.Params.Temperature, s.Params.Seed, s.Params.HasSeed = 1, uint64(i), true
		}
		r.submit(t, s)
		seqs = append(seqs, s)
	}
	for i, s := range seqs {
		res := collect(s)
		if res.err != nil {
			t.Fatalf("sequence %d: %v", i, res.err)
		}
		if s.Constraint == nil {
			continue
		}
		if res.finish != api.FinishStop {
			t.Errorf("constrained sequence %d finished %q after %d tokens", i, res.finish, len(res.tokens))
		}
		var doc []byte
		for _, tok := range res.tokens {
			if tok >= 256 {
				t.Fatalf("sequence %d sampled %d, outside the grammar", i, tok)
			}
			doc = append(doc, byte(tok))
		}
		var out struct {
			OK   *bool    `json:"ok"`
			N    *int     `json:"n"`
			Tags []string `json:"tags"`
		}
		if err := json.Unmarshal(doc, &out); err != nil || out.OK == nil || out.N == nil || *out.N > 9 || len(out.Tags) > 3 {
			t.Errorf("sequence %d: %q does not match the schema (%v)", i, doc, err)
		}
	}
}

// TestConstraintWithNoWayOut: a grammar that allows nothing more ends the
// sequence with "length", not an error.
func TestConstraintWithNoWayOut(t *testing.T) {
	const vocab = 512
	r := newRig(t, []enginetest.SimOption{enginetest.WithVocabSize(vocab), enginetest.WithEOS(300)}, nil)
	pieces := make([][]byte, vocab)
	pieces[1] = []byte("x") // no token can start a JSON value
	g, err := grammar.NewVocab(pieces, []int32{300}, nil).Compile(grammar.AnyObject, grammar.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	s := &batcher.Sequence{Prompt: prompt(1, 5), MaxTokens: 10, Constraint: g.NewMatcher()}
	r.submit(t, s)
	res := collect(s)
	if res.err != nil || res.finish != api.FinishLength || len(res.tokens) != 0 {
		t.Fatalf("got %d tokens, finish %q, err %v; want none, length, nil", len(res.tokens), res.finish, res.err)
	}
}

// forcingVocab is byteVocab without whitespace tokens, with an encoder
// that writes each byte as its id: where the grammar forces a byte, that
// byte's token is the only one allowed, so sampling one token at a time
// and jump-forward decoding produce the same tokens.
func forcingVocab(n int) *grammar.Vocab {
	pieces := make([][]byte, n)
	for i := 0; i < 256; i++ {
		if c := byte(i); c != ' ' && c != '\n' && c != '\t' && c != '\r' {
			pieces[i] = []byte{c}
		}
	}
	pieces[300] = []byte("</s>")
	v := grammar.NewVocab(pieces, []int32{300}, nil)
	v.SetEncoder(byteEncoder{})
	return v
}

type byteEncoder struct{}

func (byteEncoder) Encode(text string, _ bool) ([]int32, error) {
	ids := make([]int32, len(text))
	for i := range len(text) {
		ids[i] = int32(text[i])
	}
	return ids, nil
}

// TestJumpForward: constrained sequences decoded with jump-forward give
// exactly the tokens of sampling one token per step, greedy and seeded
// with penalties alike (forced tokens count as generated), in fewer
// engine steps, and their Usage counts the forced tokens.
func TestJumpForward(t *testing.T) {
	const vocab = 512
	v := forcingVocab(vocab)
	schema := `{"type":"object","properties":{"status":{"enum":["active","inactive"]},"count":{"type":"integer","minimum":0,"maximum":99},"kind":{"const":"record"},"tags":{"type":"array","items":{"enum":["alpha","beta"]},"maxItems":3}},"required":["status","count","kind","tags"],"additionalProperties":false}`
	g, err := v.Compile([]byte(schema), grammar.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	params := []engine.SamplingParams{
		{},
		{Temperature: 1, Seed: 7, HasSeed: true, PresencePenalty: 0.5, FrequencyPenalty: 0.3},
	}
	run := func(jump bool, p engine.SamplingParams, i int) (result, int64) {
		r := newRig(t, []enginetest.SimOption{enginetest.WithVocabSize(vocab), enginetest.WithEOS(300)}, nil, batcher.WithJumpForward(jump))
		s := &batcher.Sequence{Prompt: prompt(i, 5), MaxTokens: 200, Constraint: g.NewMatcher(), Params: p}
		r.submit(t, s)
		res := collect(s)
		if res.err != nil || res.finish != api.FinishStop {
			t.Fatalf("jump-forward %v: finish %q, err %v", jump, res.finish, res.err)
		}
		return res, r.sim.Stats().Steps
	}
	for pi, p := range params {
		for i := range 4 {
			off, offSteps := run(false, p, i)
			on, onSteps := run(true, p, i)
			if string(int32Bytes(on.tokens)) != string(int32Bytes(off.tokens)) {
				t.Fatalf("params %d prompt %d: jump-forward gave\n%s\nsampling one token a step gave\n%s", pi, i, int32Bytes(on.tokens), int32Bytes(off.tokens))
			}
			if off.usage.ForcedTokens != 0 || on.usage.ForcedTokens == 0 || on.usage.CompletionTokens != len(on.tokens) {
				t.Fatalf("usage without jump-forward %+v, with %+v (%d tokens)", off.usage, on.usage, len(on.tokens))
			}
			if onSteps*2 > offSteps {
				t.Errorf("params %d prompt %d: %d steps with jump-forward, %d without: want at most half", pi, i, onSteps, offSteps)
			}
			t.Logf("%s: %d tokens, %d forced; %d steps against %d", int32Bytes(on.tokens), len(on.tokens), on.usage.ForcedTokens, onSteps, offSteps)
		}
	}
}

// TestJumpForwardLimits: forced tokens count against MaxTokens (the
// sequence ends with "length" exactly there) and stop tokens apply to
// them.
func TestJumpForwardLimits(t *testing.T) {
	const vocab = 512
	v := forcingVocab(vocab)
	g, err := v.Compile([]byte(`{"const":{"abcdefghij":"klmnopqrst"}}`), grammar.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, []enginetest.SimOption{enginetest.WithVocabSize(vocab), enginetest.WithEOS(300)}, nil)
	s := &batcher.Sequence{Prompt: prompt(1, 5), MaxTokens: 6, Constraint: g.NewMatcher(), KeepCut: true}
	r.submit(t, s)
	res := collect(s)
	if res.err != nil || res.finish != api.FinishLength || string(int32Bytes(res.tokens)) != `{"abcd` {
		t.Fatalf("got %q, finish %q, err %v; want {\"abcd, length", int32Bytes(res.tokens), res.finish, res.err)
	}
	if res.usage.ForcedTokens != 5 {
		t.Fatalf("usage %+v: want 5 forced tokens", res.usage)
	}
	s = &batcher.Sequence{Prompt: prompt(1, 5), MaxTokens: 60, Constraint: g.NewMatcher(), StopTokens: []int32{'e'}}
	r.submit(t, s)
	res = collect(s)
	if res.err != nil || res.finish != api.FinishStop || string(int32Bytes(res.tokens)) != `{"abcd` {
		t.Fatalf("got %q, finish %q, err %v; want {\"abcd ended by the stop token", int32Bytes(res.tokens), res.finish, res.err)
	}
}

func int32Bytes(toks []int32) []byte {
	b := make([]byte, len(toks))
	for i, t := range toks {
		b[i] = byte(t)
	}
	return b
}

// TestCloseWithinBudget: a constrained sequence whose schema could go on
// far longer than its MaxTokens (an array of strings without maxItems, as
// the AI SDK's output: 'array' sends) ends with "length" on a complete
// document that parses, for every MaxTokens from the schema's minimum up,
// with jump-forward on and off, sampled and greedy; Usage counts the
// closing tokens. With KeepCut the output is cut as before.
func TestCloseWithinBudget(t *testing.T) {
	const vocab = 512
	v := forcingVocab(vocab)
	schema := `{"type":"object","properties":{"elements":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer"}},"required":["name","n"],"additionalProperties":false}}},"required":["elements"],"additionalProperties":false}`
	g, err := v.Compile([]byte(schema), grammar.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	lo := g.MinTokens()
	if lo <= 0 {
		t.Fatalf("MinTokens %d", lo)
	}
	for _, jump := range []bool{false, true} {
		r := newRig(t, []enginetest.SimOption{enginetest.WithVocabSize(vocab), enginetest.WithEOS(300)}, nil, batcher.WithJumpForward(jump))
		for i, max := range []int{lo, lo + 1, lo + 3, lo + 10, lo + 40, 120} {
			p := engine.SamplingParams{Temperature: 1, Seed: uint64(i), HasSeed: true}
			s := &batcher.Sequence{Prompt: prompt(i, 5), MaxTokens: max, Constraint: g.NewMatcher(), Params: p}
			r.submit(t, s)
			res := collect(s)
			out := int32Bytes(res.tokens)
			if res.err != nil || !json.Valid(out) || len(res.tokens) > max {
				t.Fatalf("jump %v, max_tokens %d: %q (%d tokens), err %v: want a complete document", jump, max, out, len(res.tokens), res.err)
			}
			if res.finish == api.FinishLength && res.usage.ClosingTokens == 0 {
				t.Errorf("jump %v, max_tokens %d: finished for length without closing tokens: %+v", jump, max, res.usage)
			}
			t.Logf("jump %v, max %d: %s (%s, %d closing)", jump, max, out, res.finish, res.usage.ClosingTokens)
		}
		s := &batcher.Sequence{Prompt: prompt(9, 5), MaxTokens: lo - 1, Constraint: g.NewMatcher(), KeepCut: true}
		r.submit(t, s)
		if res := collect(s); res.finish != api.FinishLength || json.Valid(int32Bytes(res.tokens)) {
			t.Fatalf("KeepCut: %q, %s: want a cut document", int32Bytes(res.tokens), res.finish)
		}
	}
}

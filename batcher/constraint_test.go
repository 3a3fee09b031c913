package batcher_test

import (
	"encoding/json"
	"testing"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
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

package pyproc

import (
	"context"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// TestJumpForwardPositions: the torch worker reports Info.JumpForward and
// counts forced tokens as generated. A seeded sequence with presence and
// frequency penalties samples t1..tn one token a step; a second one
// samples t1, is fed t1 followed by t2..t4 as forced tokens in one input,
// and from there samples exactly t5..tn: its draws continue at the
// generated position and its penalties count the forced tokens.
func TestJumpForwardPositions(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tiny(t))
	if !m.Info().JumpForward {
		t.Fatal("Info.JumpForward is false on the torch backend")
	}
	ctx := context.Background()
	p := &engine.SamplingParams{Temperature: 1, Seed: 42, HasSeed: true, PresencePenalty: 1.5, FrequencyPenalty: 0.5}
	const n = 10
	step := func(seq engine.SeqID, feed []int32) int32 {
		o, err := m.Step(ctx, []engine.StepInput{{Seq: seq, Tokens: feed, Sample: true, Params: p}})
		if err != nil {
			t.Fatal(err)
		}
		return o[0].Token
	}
	pr := prompt(5, 12)
	feed := openFeed(t, m, 1, pr)
	var want []int32
	for len(want) < n {
		tok := step(1, feed)
		want = append(want, tok)
		feed = []int32{tok}
	}
	m.Free(1, "")

	feed = openFeed(t, m, 2, pr)
	defer m.Free(2, "")
	got := []int32{step(2, feed)}
	got = append(got, want[1:4]...) // t2..t4 forced
	got = append(got, step(2, want[0:4]))
	for len(got) < n {
		got = append(got, step(2, got[len(got)-1:]))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("with t2..t4 forced the sequence went on %v; sampled one a step it was %v", got[4:], want[4:])
	}
}

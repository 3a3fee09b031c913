package batcher_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/engine/grammar"
)

// checkedMatcher wraps a grammar matcher and checks, at every Accept,
// that the mask the batcher sampled under (the slice it last filled, as
// it is now) equals the true mask of the state.
type checkedMatcher struct {
	m     *grammar.Matcher
	buf   []uint64 // the batcher's mask slice
	truth []uint64
	fills *atomic.Int64
	err   error
}

func (c *checkedMatcher) FillMask(mask []uint64) {
	c.fills.Add(1)
	c.buf = mask
	c.m.FillMask(mask)
}

func (c *checkedMatcher) Accept(tok int32) error {
	if c.truth == nil {
		c.truth = make([]uint64, len(c.buf))
	}
	c.m.FillMask(c.truth)
	if c.err == nil && !slices.Equal(c.buf, c.truth) {
		c.err = fmt.Errorf("token %d was sampled under a stale mask", tok)
	}
	return c.m.Accept(tok)
}

func (c *checkedMatcher) Done() bool { return c.m.Done() }

// looping adds the matcher's Loop.
type looping struct{ *checkedMatcher }

func (l looping) Loop(loop []uint64) int { return l.m.Loop(loop) }

// loopSpy counts the step inputs that carry a loop.
type loopSpy struct {
	engine.Model
	loops atomic.Int64
}

func (s *loopSpy) Step(ctx context.Context, batch []engine.StepInput) ([]engine.StepOutput, error) {
	for _, in := range batch {
		if in.LoopSteps > 0 {
			if len(in.Loop) < len(in.Allowed) {
				return nil, fmt.Errorf("loop of %d words for a mask of %d", len(in.Loop), len(in.Allowed))
			}
			s.loops.Add(1)
		}
	}
	return s.Model.Step(ctx, batch)
}

// TestLoopReusesMask: a constraint with loops (grammar.Matcher.Loop)
// passes them to the engine and keeps its mask after tokens in the loop
// instead of filling it again; every token is still sampled under the
// true mask, and the tokens are those of the same constraint without
// loops.
func TestLoopReusesMask(t *testing.T) {
	const vocab = 512
	v := byteVocab(vocab)
	schema := `{"type":"object","properties":{"name":{"type":"string"},"bio":{"type":"string","maxLength":30}},"required":["name","bio"],"additionalProperties":false}`
	g, err := v.Compile([]byte(schema), grammar.Limits{MaxStringLength: 40, MaxWhitespace: 1})
	if err != nil {
		t.Fatal(err)
	}
	run := func(loops bool) ([][]int32, int64, int64) {
		sim, err := enginetest.NewSim(enginetest.WithVocabSize(vocab), enginetest.WithEOS(300))
		if err != nil {
			t.Fatal(err)
		}
		m, err := sim.Load(context.Background(), engine.ModelSpec{ID: "sim"})
		if err != nil {
			t.Fatal(err)
		}
		spy := &loopSpy{Model: m}
		r := newRigModel(t, sim, spy, nil, batcher.WithJumpForward(false))
		var fills atomic.Int64
		var seqs []*batcher.Sequence
		var checks []*checkedMatcher
		for i := 0; i < 4; i++ {
			c := &checkedMatcher{m: g.NewMatcher(), fills: &fills}
			s := &batcher.Sequence{Prompt: prompt(i, 5), MaxTokens: 300, Constraint: c}
			if loops {
				s.Constraint = looping{c}
			}
			if i%2 == 1 {
				s.Params.Temperature, s.Params.Seed, s.Params.HasSeed = 1, uint64(i), true
			}
			r.submit(t, s)
			seqs, checks = append(seqs, s), append(checks, c)
		}
		var out [][]int32
		for i, s := range seqs {
			res := collect(s)
			if res.err != nil {
				t.Fatalf("sequence %d: %v", i, res.err)
			}
			if checks[i].err != nil {
				t.Fatalf("sequence %d: %v", i, checks[i].err)
			}
			out = append(out, res.tokens)
		}
		return out, fills.Load(), spy.loops.Load()
	}
	want, plainFills, plainLoops := run(false)
	got, loopFills, loopInputs := run(true)
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("with loops:\n%v\nwithout:\n%v", got, want)
	}
	t.Logf("masks filled: %d without loops, %d with; %d step inputs carried a loop", plainFills, loopFills, loopInputs)
	if plainLoops != 0 || loopInputs == 0 {
		t.Fatalf("%d and %d step inputs carried a loop, want 0 and some", plainLoops, loopInputs)
	}
	if loopFills >= plainFills*3/4 {
		t.Fatalf("%d masks filled with loops against %d without: the mask was not kept", loopFills, plainFills)
	}
}

package pyproc

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// TestAppendStepLast: a step request lists in "last" the sequences of
// the inputs that sample their last token (engine.StepInput.Last with
// Sample), only those on the worker's share of the batch, and carries
// no "last" when there are none.
func TestAppendStepLast(t *testing.T) {
	batch := []engine.StepInput{
		{Seq: 3, Tokens: []int32{1}, Sample: true, Params: greedy, Last: true},
		{Seq: 4, Tokens: []int32{2}, Sample: true, Params: greedy},
		{Seq: 5, Tokens: []int32{3, 4}, Params: greedy, Last: true}, // does not sample: nothing to leave out
		{Seq: 6, Tokens: []int32{5}, Sample: true, Params: greedy, Last: true},
	}
	for _, c := range []struct {
		idx  []int
		want string
	}{
		{[]int{0, 1, 2, 3}, `"last":[3,6]`},
		{[]int{1, 3}, `"last":[6]`},
		{[]int{1, 2}, ""},
	} {
		line := string(appendStep(nil, 1, "m", 10, batch, nil, c.idx, 0))
		if c.want == "" {
			if strings.Contains(line, `"last"`) {
				t.Errorf("inputs %v: %s carries last", c.idx, line)
			}
			continue
		}
		if !strings.Contains(line, c.want+`,"batch":[`) {
			t.Errorf("inputs %v: %s, want %s before the batch", c.idx, line, c.want)
		}
	}
}

// TestStepLast: the worker takes "last" (the batch runs as without it:
// the same greedy tokens), and on CUDA speculates no decode step behind
// a prompt step whose every input samples its last token, while a step
// without last is followed by one.
func TestStepLast(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t)
	m := load(t, e, tiny(t))
	prompt := []int32{5, 9, 13, 17, 21, 25, 29}
	launched := func() float64 {
		st, _ := workerStatsOf(t, e, m, 0)["speculated"].(map[string]any)
		n, _ := st["launched"].(float64)
		return n
	}
	cuda := os.Getenv("MLXSERVING_TEST_DEVICE") == "cuda"
	var toks [2]int32
	for i, last := range []bool{false, true} {
		id := engine.SeqID(10 + i)
		if _, err := m.Open(ctx, id, prompt, ""); err != nil {
			t.Fatal(err)
		}
		var before float64
		if cuda {
			before = launched()
		}
		out, err := m.Step(ctx, []engine.StepInput{{Seq: id, Tokens: prompt, Sample: true, Params: greedy, Last: last}})
		if err != nil {
			t.Fatalf("last=%v: %v", last, err)
		}
		toks[i] = out[0].Token
		if cuda {
			if n := launched() - before; (n == 0) != last {
				t.Errorf("last=%v: %v decode steps speculated behind the prompt step", last, n)
			}
		}
		m.Free(id, "")
	}
	if toks[0] != toks[1] {
		t.Errorf("greedy tokens %d without last, %d with", toks[0], toks[1])
	}
}

// TestLookaheadLastNoTopUp: a sequence answered from its lookahead
// buffer in a step that needs the worker for another input has its
// buffer topped up, unless its token is its last (Last): nothing more of
// it will be asked.
func TestLookaheadLastNoTopUp(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, WithLookahead(4))
	m := load(t, e, tiny(t))
	left := func(last bool, base engine.SeqID) int {
		a, b := base, base+1
		toks := map[engine.SeqID]int32{}
		for _, id := range []engine.SeqID{a, b} {
			if _, err := m.Open(ctx, id, prompt(int(id), 6), ""); err != nil {
				t.Fatal(err)
			}
			defer m.Free(id, "")
		}
		step := func(in ...engine.StepInput) {
			t.Helper()
			outs, err := m.Step(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			for i, o := range outs {
				toks[in[i].Seq] = o.Token
			}
		}
		step(engine.StepInput{Seq: a, Tokens: prompt(int(a), 6), Sample: true, Params: greedy},
			engine.StepInput{Seq: b, Tokens: prompt(int(b), 6), Sample: true, Params: greedy})
		// Both decode ahead (lookahead 4): their buffers fill.
		step(engine.StepInput{Seq: a, Tokens: []int32{toks[a]}, Sample: true, Params: greedy},
			engine.StepInput{Seq: b, Tokens: []int32{toks[b]}, Sample: true, Params: greedy})
		if len(m.look[a].buf) == 0 {
			t.Fatalf("no tokens decoded ahead for sequence %d", a)
		}
		// a from its buffer; b fed a token it was not given: the worker runs.
		step(engine.StepInput{Seq: a, Tokens: []int32{toks[a]}, Sample: true, Params: greedy, Last: last},
			engine.StepInput{Seq: b, Tokens: []int32{(toks[b] + 1) % 50}, Sample: true, Params: greedy})
		return len(m.look[a].buf)
	}
	topped, kept := left(false, 100), left(true, 200)
	if kept >= topped {
		t.Errorf("buffer after a step: %d tokens with Last, %d without; want fewer with Last (no top-up)", kept, topped)
	}
}

// TestLookaheadLastAlone: a step whose only input samples its last token
// decodes nothing ahead of it (lookahead 4 would decode three more), and
// one beside an input that decodes ahead keeps its lookahead (the
// worker's chain runs in lockstep).
func TestLookaheadLastAlone(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, WithLookahead(4))
	m := load(t, e, tiny(t))
	open := func(id engine.SeqID) int32 {
		t.Helper()
		p := prompt(int(id), 6)
		if _, err := m.Open(ctx, id, p, ""); err != nil {
			t.Fatal(err)
		}
		outs, err := m.Step(ctx, []engine.StepInput{{Seq: id, Tokens: p, Sample: true, Params: greedy}})
		if err != nil {
			t.Fatal(err)
		}
		return outs[0].Token
	}
	buffered := func(last ...bool) []int {
		t.Helper()
		in := make([]engine.StepInput, len(last))
		for i, l := range last {
			id := engine.SeqID(300 + 10*len(last) + i)
			in[i] = engine.StepInput{Seq: id, Tokens: []int32{open(id)}, Sample: true, Params: greedy, Last: l}
			defer m.Free(id, "")
		}
		if _, err := m.Step(ctx, in); err != nil {
			t.Fatal(err)
		}
		out := make([]int, len(in))
		for i := range in {
			out[i] = len(m.look[in[i].Seq].buf)
		}
		return out
	}
	if got := buffered(true); got[0] != 0 {
		t.Errorf("a lone last input: %d tokens decoded ahead, want none", got[0])
	}
	if got := buffered(false); got[0] == 0 {
		t.Errorf("a lone input not last: nothing decoded ahead")
	}
	if got := buffered(true, false); got[0] == 0 || got[1] == 0 {
		t.Errorf("a last input beside one decoding ahead: buffers %v, want both filled (lockstep)", got)
	}
}

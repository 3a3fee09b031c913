package enginetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

func TestStepTakesItsStepTime(t *testing.T) {
	// A lower bound only: a Step never returns before its modelled time.
	_, m := newModel(t, WithStepTime(20*time.Millisecond, time.Millisecond))
	if _, err := m.Open(context.Background(), 1, make([]int32, 5), ""); err != nil {
		t.Fatal(err)
	}
	defer m.Free(1, "")
	start := time.Now()
	step(t, m, 1, make([]int32, 5), greedy)
	if took := time.Since(start); took < 25*time.Millisecond {
		t.Errorf("a step of 5 tokens took %v; want at least 20ms + 5*1ms", took)
	}
}

func TestStepHonoursContextWhileWaiting(t *testing.T) {
	sim, m := newModel(t, WithStepTime(time.Hour, 0))
	if _, err := m.Open(context.Background(), 1, []int32{1, 2}, ""); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(10*time.Millisecond, cancel)
	_, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: []int32{1, 2}, Sample: true, Params: greedy}})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Step cancelled while waiting: %v; want context.Canceled", err)
	}
	m.Free(1, "")
	if st := sim.Stats(); st.OpenSequences != 0 || st.KVTokens != 0 {
		t.Errorf("after freeing the cancelled sequence: %+v", st)
	}
}

func TestCloseEndsAWaitingStep(t *testing.T) {
	sim, m := newModel(t, WithStepTime(time.Hour, 0))
	if _, err := m.Open(context.Background(), 1, []int32{1, 2}, ""); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(10*time.Millisecond, func() { _ = sim.Close() })
	_, err := m.Step(context.Background(), []engine.StepInput{{Seq: 1, Tokens: []int32{1, 2}, Sample: true, Params: greedy}})
	if !errors.Is(err, engine.ErrClosed) {
		t.Errorf("Step during Close: %v; want engine.ErrClosed", err)
	}
	m.Free(1, "") // a no-op after Close
}

func TestBadStepsAreRefusedWithoutEffect(t *testing.T) {
	sim, m := newModel(t, WithVocabSize(100), WithContextLength(16), WithMaxBatch(2))
	ctx := context.Background()
	for id := range engine.SeqID(3) {
		if _, err := m.Open(ctx, id, []int32{1, 2, 3}, ""); err != nil {
			t.Fatal(err)
		}
		defer m.Free(id, "")
	}
	in := func(id engine.SeqID, tokens ...int32) engine.StepInput {
		return engine.StepInput{Seq: id, Tokens: tokens, Sample: true, Params: greedy}
	}
	noParams := in(1, 1)
	noParams.Params = nil
	hot := in(1, 1)
	hot.Params = &engine.SamplingParams{Temperature: 5}
	for name, c := range map[string]struct {
		batch []engine.StepInput
		want  error
	}{
		"over max batch":  {[]engine.StepInput{in(0, 1), in(1, 1), in(2, 1)}, engine.ErrInvalidParam},
		"unknown seq":     {[]engine.StepInput{in(0, 1), in(9, 1)}, engine.ErrInvalidParam},
		"seq twice":       {[]engine.StepInput{in(0, 1), in(0, 2)}, engine.ErrInvalidParam},
		"no tokens":       {[]engine.StepInput{in(0, 1), in(1)}, engine.ErrInvalidParam},
		"no params":       {[]engine.StepInput{in(0, 1), noParams}, engine.ErrInvalidParam},
		"bad params":      {[]engine.StepInput{in(0, 1), hot}, engine.ErrInvalidParam},
		"token too large": {[]engine.StepInput{in(0, 1), in(1, 100)}, engine.ErrInvalidParam},
		"token negative":  {[]engine.StepInput{in(0, 1), in(1, -1)}, engine.ErrInvalidParam},
		"over context":    {[]engine.StepInput{in(0, 1), in(1, make([]int32, 17)...)}, engine.ErrContextLength},
	} {
		if _, err := m.Step(ctx, c.batch); !errors.Is(err, c.want) {
			t.Errorf("%s: %v; want %v", name, err, c.want)
		}
	}
	var cle *engine.ContextLengthError
	if _, err := m.Step(ctx, []engine.StepInput{in(1, make([]int32, 17)...)}); !errors.As(err, &cle) || cle.Prompt != 17 || cle.Limit != 16 {
		t.Errorf("over context: %v; want a *engine.ContextLengthError of 17 tokens, limit 16", err)
	}
	if st := sim.Stats(); st.Steps != 0 || st.KVTokens != 9 {
		t.Errorf("refused steps changed the model: %+v", st)
	}
	// Sequence 0 was in every refused batch; it still has only its prompt.
	if got, want := step(t, m, 0, []int32{1, 2, 3}, greedy), step(t, m, 2, []int32{1, 2, 3}, greedy); got != want {
		t.Errorf("after refused steps: %d; an untouched twin gives %d", got, want)
	}
}

func TestBadOpensAreRefused(t *testing.T) {
	sim, m := newModel(t, WithVocabSize(100), WithContextLength(16))
	ctx := context.Background()
	if _, err := m.Open(ctx, 1, []int32{1}, ""); err != nil {
		t.Fatal(err)
	}
	defer m.Free(1, "")
	for name, c := range map[string]struct {
		id     engine.SeqID
		prompt []int32
		want   error
	}{
		"empty prompt":    {2, nil, engine.ErrInvalidParam},
		"open twice":      {1, []int32{1}, engine.ErrInvalidParam},
		"token too large": {2, []int32{1, 100}, engine.ErrInvalidParam},
		"over context":    {2, make([]int32, 17), engine.ErrContextLength},
	} {
		if _, err := m.Open(ctx, c.id, c.prompt, ""); !errors.Is(err, c.want) {
			t.Errorf("%s: %v; want %v", name, err, c.want)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := m.Open(cancelled, 3, []int32{1}, ""); !errors.Is(err, context.Canceled) {
		t.Errorf("Open under a cancelled context: %v", err)
	}
	if n := sim.Stats().OpenSequences; n != 1 {
		t.Errorf("refused opens left %d sequences open; want 1", n)
	}
}

// generate returns n tokens for prompt alone.
func generate(t *testing.T, m engine.Model, id engine.SeqID, prompt []int32, n int, params *engine.SamplingParams) []int32 {
	t.Helper()
	p := &plan{id: id, prompt: prompt, n: n, params: params}
	if err := drive(context.Background(), m, []*plan{p}); err != nil {
		t.Fatal(err)
	}
	return p.out
}

func TestEOSProbability(t *testing.T) {
	_, m := newModel(t, WithVocabSize(50), WithEOS(7), WithEOSProbability(0.1))
	var eos, total int
	for i := range 20 {
		p := promptTokens(i, 6, 50)
		out := generate(t, m, engine.SeqID(i), p, 30, greedy)
		if !slices.Equal(out, generate(t, m, engine.SeqID(100+i), p, 30, greedy)) {
			t.Fatalf("prompt %d: EOS placement is not deterministic", i)
		}
		for _, tok := range out {
			if tok == 7 {
				eos++
			}
		}
		total += len(out)
	}
	if eos == 0 || eos > total/4 {
		t.Errorf("%d EOS in %d tokens at probability 0.1", eos, total)
	}
	// Without the probability, the EOS id never appears, even in a small
	// vocabulary.
	_, quiet := newModel(t, WithVocabSize(4), WithEOS(2))
	if out := generate(t, quiet, 1, []int32{1}, 200, greedy); slices.Contains(out, 2) {
		t.Errorf("EOS sampled at probability 0: %v", out)
	}
}

func TestPrefixCacheIsBounded(t *testing.T) {
	sim, m := newModel(t, WithPrefixCacheEntries(1), WithKVCapacity(30))
	a, b := promptTokens(1, 10, 200), promptTokens(2, 10, 200)
	for i, p := range [][]int32{a, b} {
		id := engine.SeqID(i)
		if _, err := m.Open(context.Background(), id, p, ""); err != nil {
			t.Fatal(err)
		}
		step(t, m, id, p, greedy)
		m.Free(id, string(rune('a'+i)))
	}
	if kv := sim.Stats().KVTokens; kv != 0 {
		t.Errorf("saved prefixes count %d KV tokens against capacity", kv)
	}
	for _, c := range []struct {
		key    string
		prompt []int32
		want   int
	}{{"a", append(a, 1), 0}, {"b", append(b, 1), 10}} {
		r, err := m.Open(context.Background(), 9, c.prompt, c.key)
		if err != nil {
			t.Fatal(err)
		}
		m.Free(9, "")
		if r != c.want {
			t.Errorf("key %q: reused %d, want %d", c.key, r, c.want)
		}
	}
}

func TestLogprobsAndUnseededSampling(t *testing.T) {
	_, m := newModel(t)
	p := promptTokens(3, 8, 200)
	withLP := &engine.SamplingParams{Logprobs: true}
	if _, err := m.Open(context.Background(), 1, p, ""); err != nil {
		t.Fatal(err)
	}
	out, err := m.Step(context.Background(), []engine.StepInput{{Seq: 1, Tokens: p, Sample: true, Params: withLP}})
	m.Free(1, "")
	if err != nil {
		t.Fatal(err)
	}
	if lp := out[0].Logprob; lp > 0 || lp < -logprobMax {
		t.Errorf("logprob %v, want in [-%v, 0]", lp, logprobMax)
	}
	if got := generate(t, m, 2, p, 1, greedy); got[0] != out[0].Token {
		t.Errorf("asking for logprobs changed the token: %d vs %d", out[0].Token, got[0])
	}
	// Unseeded sampling draws a seed per sequence: two runs differ.
	warm := &engine.SamplingParams{Temperature: 1}
	if a, b := generate(t, m, 3, p, 16, warm), generate(t, m, 4, p, 16, warm); slices.Equal(a, b) {
		t.Errorf("two unseeded samplings gave the same 16 tokens %v", a)
	}
}

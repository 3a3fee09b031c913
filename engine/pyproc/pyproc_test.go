package pyproc

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

func TestGenerateIsDeterministicAndVaried(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tiny(t))
	info := m.Info()
	if info.VocabSize != 384 || info.ContextLength != 512 || info.BOS < 0 || len(info.EOS) == 0 || info.KVCapacity <= 0 || info.Engine != "pyproc" {
		t.Fatalf("info %+v", info)
	}
	a := generate(t, m, 1, prompt(1, 9), 12)
	b := generate(t, m, 2, prompt(1, 9), 12)
	if !slices.Equal(a, b) {
		t.Fatalf("same prompt, different tokens: %v vs %v", a, b)
	}
	distinct := map[int32]bool{}
	for s := 2; s < 8; s++ {
		out := generate(t, m, engine.SeqID(10+s), prompt(s, 5+s), 4)
		distinct[out[0]] = true
	}
	if len(distinct) < 3 {
		t.Fatalf("six prompts gave only %d distinct first tokens", len(distinct))
	}
}

// TestBatchedEqualsAlone runs sequences of different lengths together, with
// prefill chunks mixed into decode steps, and checks each gets exactly the
// tokens it gets alone.
func TestBatchedEqualsAlone(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tiny(t))
	const n = 10
	prompts := [][]int32{prompt(1, 3), prompt(2, 17), prompt(3, 1), prompt(4, 40), prompt(5, 8), prompt(6, 23)}
	want := make([][]int32, len(prompts))
	for i, p := range prompts {
		want[i] = generate(t, m, engine.SeqID(100+i), p, n)
	}
	fed := make([]int, len(prompts)) // prompt tokens fed so far
	for i, p := range prompts {
		fed[i] = len(p) - len(openFeed(t, m, engine.SeqID(i), p))
		defer m.Free(engine.SeqID(i), "")
	}
	got := stepStaggered(t, m, prompts, fed, n, 7) // prefill in chunks of up to 7 tokens
	for i := range prompts {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("seq %d: batched %v, alone %v", i, got[i], want[i])
		}
	}
}

func TestSampling(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tiny(t))
	ctx := context.Background()
	run := func(seq engine.SeqID, p *engine.SamplingParams) []int32 {
		if _, err := m.Open(ctx, seq, prompt(3, 6), ""); err != nil {
			t.Fatal(err)
		}
		defer m.Free(seq, "")
		var out []int32
		feed := prompt(3, 6)
		for range 16 {
			o, err := m.Step(ctx, []engine.StepInput{{Seq: seq, Tokens: feed, Sample: true, Params: p}})
			if err != nil {
				t.Fatal(err)
			}
			if p.Logprobs && (o[0].Logprob >= 0 || o[0].Logprob < -20) {
				t.Fatalf("logprob %v", o[0].Logprob)
			}
			out = append(out, o[0].Token)
			feed = []int32{o[0].Token}
		}
		return out
	}
	seeded := &engine.SamplingParams{Temperature: 1, TopP: 0.9, TopK: 50, MinP: 0.01, RepetitionPenalty: 1.1, Seed: 42, HasSeed: true, Logprobs: true}
	a, b := run(1, seeded), run(2, seeded)
	if !slices.Equal(a, b) {
		t.Fatalf("same seed, different tokens: %v vs %v", a, b)
	}
	other := *seeded
	other.Seed = 43
	if c := run(3, &other); slices.Equal(a, c) {
		t.Fatalf("seeds 42 and 43 gave the same 16 tokens %v", a)
	}
	if g := run(4, greedy); slices.Equal(a, g) {
		t.Fatalf("sampling at temperature 1 matched greedy: %v", a)
	}
	// top_k 1 is greedy whatever the temperature.
	if k1 := run(5, &engine.SamplingParams{Temperature: 1.5, TopK: 1}); !slices.Equal(k1, run(6, greedy)) {
		t.Fatalf("top_k 1 %v differs from greedy", k1)
	}
	if _, err := m.Open(ctx, 9, prompt(1, 3), ""); err != nil {
		t.Fatal(err)
	}
	defer m.Free(9, "")
	_, err := m.Step(ctx, []engine.StepInput{{Seq: 9, Tokens: prompt(1, 3), Sample: true, Params: &engine.SamplingParams{TopP: 1.5}}})
	if !errors.Is(err, engine.ErrInvalidParam) {
		t.Fatalf("top_p 1.5: %v, want ErrInvalidParam", err)
	}
}

func TestPrefixReuse(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tiny(t))
	ctx := context.Background()
	p := prompt(2, 30)
	want := generate(t, m, 1, append(slices.Clone(p), prompt(9, 5)...), 6)

	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 2, Tokens: openFeed(t, m, 2, p)}}); err != nil {
		t.Fatal(err)
	}
	m.Free(2, "session-a")
	full := append(slices.Clone(p), prompt(9, 5)...)
	reused, err := m.Open(ctx, 3, full, "session-a")
	if err != nil {
		t.Fatal(err)
	}
	if reused != len(p) {
		t.Fatalf("reused %d tokens, want %d", reused, len(p))
	}
	var got []int32
	feed := full[reused:]
	for range 6 {
		o, err := m.Step(ctx, []engine.StepInput{{Seq: 3, Tokens: feed, Sample: true, Params: greedy}})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, o[0].Token)
		feed = []int32{o[0].Token}
	}
	m.Free(3, "")
	if !slices.Equal(got, want) {
		t.Fatalf("with reused prefix %v, from scratch %v", got, want)
	}
	// A key whose tokens do not start the prompt reuses nothing; an
	// identical prompt reuses all but one token.
	if r, err := m.Open(ctx, 4, prompt(7, 10), "session-a"); err != nil || r != 0 {
		t.Fatalf("mismatched prefix: reused %d, %v", r, err)
	}
	m.Free(4, "")
	if r, err := m.Open(ctx, 5, p, "session-a"); err != nil || r != len(p)-1 {
		t.Fatalf("same prompt: reused %d, %v; want %d", r, err, len(p)-1)
	}
	m.Free(5, "")
}

func TestContextAndBadInput(t *testing.T) {
	e := newEngine(t)
	m := load(t, e, tiny(t))
	ctx := context.Background()
	var cle *engine.ContextLengthError
	if _, err := m.Open(ctx, 1, make([]int32, 513), ""); !errors.As(err, &cle) || cle.Limit != 512 {
		t.Fatalf("513-token prompt: %v", err)
	}
	if _, err := m.Open(ctx, 2, prompt(1, 510), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 2, Tokens: make([]int32, 513)}}); !errors.As(err, &cle) {
		t.Fatalf("overflowing step: %v", err)
	}
	m.Free(2, "")
	if _, err := m.Open(ctx, 3, []int32{1, 99999}, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 3, Tokens: []int32{1, 99999}, Sample: true, Params: greedy}}); !errors.Is(err, engine.ErrInvalidParam) {
		t.Fatalf("token outside the vocabulary: %v", err)
	}
	m.Free(3, "")
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 77, Tokens: []int32{1}}}); !errors.Is(err, engine.ErrInvalidParam) {
		t.Fatalf("unopened sequence: %v", err)
	}
	// The model still works.
	generate(t, m, 4, prompt(1, 4), 2)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Open(ctx, 5, prompt(1, 4), ""); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("Open after Close: %v", err)
	}
}

// stepStaggered drives the open sequences 0..len(prompts)-1 of m
// together until each has generated n greedy tokens: sequence i joins at
// step i, fed[i] of its prompt already in its KV, the rest fed in chunks of
// up to chunk tokens beside the others' decodes. It returns each
// sequence's tokens; the caller frees the sequences.
func stepStaggered(t *testing.T, m engine.Model, prompts [][]int32, fed []int, n, chunk int) [][]int32 {
	t.Helper()
	ctx := context.Background()
	got := make([][]int32, len(prompts))
	for step := 0; ; step++ {
		var batch []engine.StepInput
		for i, p := range prompts {
			if len(got[i]) == n || i > step { // stagger the starts
				continue
			}
			in := engine.StepInput{Seq: engine.SeqID(i), Params: greedy}
			if fed[i] < len(p) {
				end := min(fed[i]+chunk, len(p))
				in.Tokens, in.Sample = p[fed[i]:end], end == len(p)
				fed[i] = end
			} else {
				in.Tokens, in.Sample = got[i][len(got[i])-1:], true
			}
			batch = append(batch, in)
		}
		if len(batch) == 0 {
			return got
		}
		outs, err := m.Step(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		k := 0
		for _, in := range batch {
			if in.Sample {
				if outs[k].Seq != in.Seq {
					t.Fatalf("output %d is for seq %d, want %d", k, outs[k].Seq, in.Seq)
				}
				got[in.Seq] = append(got[in.Seq], outs[k].Token)
				k++
			}
		}
		if k != len(outs) {
			t.Fatalf("%d outputs for %d sampling inputs", len(outs), k)
		}
	}
}

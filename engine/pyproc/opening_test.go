package pyproc

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// openingCase is a sequence of TestPipelineOpeningChunk: opened with key
// (its saved prefix reused) for prompt, its first chunk prompt[:first]
// sent as an Opening input; sync: opened with Open before the step.
type openingCase struct {
	name   string
	key    string
	prompt []int32
	first  int
	reused int
	sync   bool
}

// samples reports whether the case's Opening chunk ends the prompt.
func (c openingCase) samples() bool { return c.first == len(c.prompt) }

// openingGen is how many tokens each case decodes: the ones after the
// first show that the sequence holds the KV the synchronous one does.
const openingGen = 4

// TestPipelineOpeningChunk checks Opening inputs on two workers: a
// sequence's first prompt chunk, from its first token, sent in the step
// behind its OpenAsync before the open was answered, feeds only the
// tokens past the prefix the open reused. A chunk shorter than the reused
// prefix (it feeds nothing), a longer one, the whole prompt sampling, a
// sequence whose open reuses nothing and one opened with Open and not fed
// yet each give the tokens of a synchronous Open and Step of the prompt
// past the reused prefix, the later decoded tokens included (the same KV
// length). Opening in a Step, on a Prev input and for a sequence fed
// since its open is refused with an *engine.InvalidParamError; a chunk
// that feeds nothing and samples fails at the worker, changing nothing.
func TestPipelineOpeningChunk(t *testing.T) {
	ctx := context.Background()
	e := pipeEngine(t, WithWorkers(2), WithTuning(Tuning{NoPrefixCache: true}))
	m := load(t, e, tiny(t))
	const held = 24 // the tokens saved under each key
	keys := []string{"opening-a", "opening-b"}
	saved := openingPrefixes(t, m, keys, held)
	ext := func(base []int32, seed int) []int32 { return append(slices.Clone(base), prompt(seed, 16)...) }
	cases := []openingCase{
		{"shorter than the reused prefix", keys[0], ext(saved[0], 50), 10, held, false},
		{"longer than the reused prefix", keys[0], ext(saved[0], 51), 32, held, false},
		{"the whole prompt, sampling", keys[1], ext(saved[1], 52), 40, held, false},
		{"an open reusing nothing", "", prompt(53, 40), 40, 0, false},
		{"an open answered before the step", keys[1], ext(saved[1], 54), 30, held, true},
	}
	want := make([][]int32, len(cases))
	for i, c := range cases {
		want[i] = openingReference(t, m, engine.SeqID(100+i), c)
	}
	got := openingPipelined(t, m, cases, 200)
	for i, c := range cases {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("%s: %v, want %v (Open and Step of the prompt past the reused prefix)", c.name, got[i], want[i])
		}
	}
	if len(m.fresh) != 0 || m.inflight != 0 {
		t.Errorf("after the script: fresh %v, %d out", m.fresh, m.inflight)
	}

	// Opening in a synchronous Step, even of a sequence fed nothing yet.
	var bad *engine.InvalidParamError
	c := cases[0]
	if _, err := m.Open(ctx, 300, c.prompt, c.key); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Step(ctx, []engine.StepInput{{Seq: 300, Tokens: c.prompt[:c.first], Opening: true}}); !errors.As(err, &bad) {
		t.Errorf("Opening in a Step: %v, want an *engine.InvalidParamError", err)
	}
	m.Free(300, "")

	// A chunk within the reused prefix that samples: the worker refuses
	// the step, and the sequence then steps as if it had not been sent.
	po, ok := m.OpenAsync(ctx, 301, c.prompt, c.key)
	if !ok {
		t.Fatal("OpenAsync declined")
	}
	n, ok, err := m.StepAsync(ctx, []engine.StepInput{{Seq: 301, Tokens: c.prompt[:c.first], Opening: true, Sample: true, Params: greedy}})
	if err != nil || !ok {
		t.Fatalf("StepAsync: ok %v, %v", ok, err)
	}
	if _, err := n.Wait(ctx); !errors.Is(err, engine.ErrInvalidParam) {
		t.Errorf("an Opening chunk that feeds nothing and samples: %v, want invalid", err)
	}
	if reused, err := po.Wait(ctx); err != nil || reused != c.reused {
		t.Fatalf("the open: reused %d, %v; want %d", reused, err, c.reused)
	}
	if toks := openingDecode(t, m, 301, c.prompt[c.reused:], openingGen); !slices.Equal(toks, want[0]) {
		t.Errorf("after the refused chunk: %v, want %v", toks, want[0])
	}
	m.Free(301, "")
}

// openingPrefixes saves a prefix of n tokens under each key, each from a
// sequence of its own, opened together so that two workers hold one
// each (the least-loaded worker takes each open).
func openingPrefixes(t *testing.T, m *Model, keys []string, n int) [][]int32 {
	t.Helper()
	var out [][]int32
	for i := range keys {
		p := prompt(40+i, n)
		if _, err := stepSeq(m, engine.SeqID(90+i), openFeed(t, m, engine.SeqID(90+i), p), false); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	for i, k := range keys {
		m.Free(engine.SeqID(90+i), k)
	}
	return out
}

// openingReference runs case c synchronously on sequence id: Open, the
// prompt past the reused prefix in the chunks the pipelined run feeds,
// then decoding.
func openingReference(t *testing.T, m *Model, id engine.SeqID, c openingCase) []int32 {
	t.Helper()
	reused, err := m.Open(context.Background(), id, c.prompt, c.key)
	if err != nil || reused != c.reused {
		t.Fatalf("%s: Open reused %d, %v; want %d", c.name, reused, err, c.reused)
	}
	defer m.Free(id, "")
	at := max(reused, c.first)
	if !c.samples() && at > reused {
		if _, err := stepSeq(m, id, c.prompt[reused:at], false); err != nil {
			t.Fatal(err)
		}
	}
	if c.samples() {
		at = reused
	}
	return openingDecode(t, m, id, c.prompt[at:], openingGen)
}

// openingDecode feeds feed to sequence id, sampling, and decodes until it
// has n tokens.
func openingDecode(t *testing.T, m *Model, id engine.SeqID, feed []int32, n int) []int32 {
	t.Helper()
	var out []int32
	for len(out) < n {
		tok, err := stepSeq(m, id, feed, true)
		if err != nil {
			t.Fatal(err)
		}
		out, feed = append(out, tok), []int32{tok}
	}
	return out
}

// openingPipelined runs cases as a pipelining caller does, on sequences
// base+i: every open sent with OpenAsync (sync cases: Open), step N the
// Opening chunks sent at once behind them, then — the opens waited for,
// step N not yet — step N+1 with the rest of each prompt (Prev for a
// chunk that sampled), and decoding after. While N is out it checks the
// refusals of Opening on a Prev input and for a sequence fed since its
// open.
func openingPipelined(t *testing.T, m *Model, cases []openingCase, base engine.SeqID) [][]int32 {
	t.Helper()
	ctx := context.Background()
	opens := make([]engine.PendingOpen, len(cases))
	var batch []engine.StepInput
	for i, c := range cases {
		id := base + engine.SeqID(i)
		if c.sync {
			if reused, err := m.Open(ctx, id, c.prompt, c.key); err != nil || reused != c.reused {
				t.Fatalf("%s: Open reused %d, %v; want %d", c.name, reused, err, c.reused)
			}
		} else {
			po, ok := m.OpenAsync(ctx, id, c.prompt, c.key)
			if !ok {
				t.Fatal("OpenAsync declined")
			}
			opens[i] = po
		}
		batch = append(batch, engine.StepInput{Seq: id, Tokens: c.prompt[:c.first], Opening: true, Sample: c.samples(), Params: greedy})
	}
	if m.seqs[base].proc == m.seqs[base+2].proc {
		t.Fatal("the prefixes saved under the two keys are on one worker")
	}
	n, ok, err := m.StepAsync(ctx, batch)
	if err != nil || !ok {
		t.Fatalf("step N: ok %v, %v", ok, err)
	}
	var bad *engine.InvalidParamError
	again := batch[0]
	prevOpening := engine.StepInput{Seq: base + 2, Prev: true, Opening: true, Sample: true, Params: greedy}
	for what, in := range map[string]engine.StepInput{"Opening of a sequence fed since its open": again, "Opening on a Prev input": prevOpening} {
		if _, _, err := m.StepAsync(ctx, []engine.StepInput{in}); !errors.As(err, &bad) {
			t.Errorf("%s: %v, want an *engine.InvalidParamError", what, err)
		}
	}
	next := make([]engine.StepInput, len(cases))
	for i, c := range cases {
		if opens[i] != nil {
			if reused, err := opens[i].Wait(ctx); err != nil || reused != c.reused {
				t.Fatalf("%s: the open reused %d, %v; want %d", c.name, reused, err, c.reused)
			}
		}
		next[i] = engine.StepInput{Seq: base + engine.SeqID(i), Prev: true, Sample: true, Params: greedy}
		if !c.samples() {
			next[i].Prev, next[i].Tokens = false, c.prompt[max(c.reused, c.first):]
		}
	}
	n1, ok, err := m.StepAsync(ctx, next)
	if err != nil || !ok {
		t.Fatalf("step N+1: ok %v, %v", ok, err)
	}
	got := make([][]int32, len(cases))
	for _, w := range []struct {
		p     engine.PendingStep
		batch []engine.StepInput
	}{{n, batch}, {n1, next}} {
		outs, err := w.p.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		k := 0
		for _, in := range w.batch {
			if in.Sample {
				got[in.Seq-base] = append(got[in.Seq-base], outs[k].Token)
				k++
			}
		}
	}
	for i := range cases {
		id := base + engine.SeqID(i)
		toks := got[i]
		got[i] = append(toks, openingDecode(t, m, id, toks[len(toks)-1:], openingGen-len(toks))...)
		m.Free(id, "")
	}
	return got
}

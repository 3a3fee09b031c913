package grammar

import (
	"encoding/json"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"
)

// cloneMatcher copies m's state into a fresh matcher (stacks are
// immutable, so sharing them is safe).
func cloneMatcher(m *Matcher) *Matcher {
	return &Matcher{g: m.g, w: walker{g: m.g}, states: slices.Clone(m.states), free: m.free}
}

func setBits(mask []uint64) []int32 {
	var ids []int32
	for i, w := range mask {
		for ; w != 0; w &= w - 1 {
			ids = append(ids, int32(i*64+bits.TrailingZeros64(w)))
		}
	}
	return ids
}

// checkLoop compares Loop's claim at m's state with the truth: every
// token of the loop is allowed, and any run of up to steps loop tokens
// leaves FillMask's mask unchanged after each. It returns steps.
func checkLoop(t *testing.T, m *Matcher, rng *rand.Rand, prefix []byte) int {
	t.Helper()
	v := m.g.v
	mask := make([]uint64, v.words)
	loop := make([]uint64, v.words)
	m.FillMask(mask)
	steps := m.Loop(loop)
	ids := setBits(loop)
	if steps == 0 {
		if len(ids) != 0 {
			t.Fatalf("after %q: Loop returned 0 with %d tokens set", prefix, len(ids))
		}
		return 0
	}
	if len(ids) == 0 {
		t.Fatalf("after %q: Loop returned %d steps and no token", prefix, steps)
	}
	for _, id := range ids {
		if mask[id>>6]&(1<<(id&63)) == 0 {
			t.Fatalf("after %q: loop token %d (%q) is not allowed", prefix, id, v.pieces[id])
		}
	}
	got := make([]uint64, v.words)
	// Every loop token (a sample of them on large vocabularies) after one step.
	for k := 0; k < min(len(ids), 64); k++ {
		id := ids[k]
		if len(ids) > 64 {
			id = ids[rng.IntN(len(ids))]
		}
		c := cloneMatcher(m)
		if err := c.Accept(id); err != nil {
			t.Fatalf("after %q: loop token %d (%q): %v", prefix, id, v.pieces[id], err)
		}
		c.FillMask(got)
		if !slices.Equal(got, mask) {
			t.Fatalf("after %q + %q: the mask changed (loop of %d steps)", prefix, v.pieces[id], steps)
		}
	}
	// Runs of steps tokens, the longest loop tokens favoured.
	long := slices.Clone(ids)
	slices.SortFunc(long, func(a, b int32) int { return len(v.pieces[b]) - len(v.pieces[a]) })
	for run := 0; run < 3; run++ {
		c := cloneMatcher(m)
		text := slices.Clone(prefix)
		for s := 0; s < steps; s++ {
			id := ids[rng.IntN(len(ids))]
			if run == 0 {
				id = long[rng.IntN(min(len(long), 4))]
			}
			if err := c.Accept(id); err != nil {
				t.Fatalf("after %q: loop token %d (%q) at step %d of %d: %v", text, id, v.pieces[id], s+1, steps, err)
			}
			text = append(text, v.pieces[id]...)
			c.FillMask(got)
			if !slices.Equal(got, mask) {
				t.Fatalf("after %q: the mask changed at step %d of a loop of %d", text, s+1, steps)
			}
		}
	}
	return steps
}

// TestLoopMatchesTruth checks Matcher.Loop against Accept and FillMask
// by brute force, along random documents of random schemas and of
// schemas with free strings.
func TestLoopMatchesTruth(t *testing.T) {
	vocabs := map[string]func(testing.TB) *Vocab{
		"bytes":  func(testing.TB) *Vocab { return byteVocab() },
		"llama3": func(t testing.TB) *Vocab { return realVocab(t, "llama3") },
	}
	fixed := []string{
		`{"type":"object"}`,
		`{"type":"string"}`,
		`{"type":"string","minLength":5,"maxLength":40}`,
		`{"type":"object","properties":{"name":{"type":"string"},"bio":{"type":"string","maxLength":60},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","bio","tags"]}`,
	}
	for name, mk := range vocabs {
		t.Run(name, func(t *testing.T) {
			v := mk(t)
			rng := rand.New(rand.NewPCG(23, uint64(len(name))))
			schemas := slices.Clone(fixed)
			n := 30
			if testing.Short() {
				n = 8
			}
			for i := 0; i < n; i++ {
				defs := map[string]any{}
				s := randSchema(rng, 0, defs)
				if len(defs) > 0 {
					s = map[string]any{"$defs": defs, "anyOf": []any{s}}
				}
				raw, _ := json.Marshal(s)
				schemas = append(schemas, string(raw))
			}
			loops, total := 0, 0
			for _, schema := range schemas {
				for _, lim := range []Limits{{MaxStringLength: 24, MaxFreeTokens: 40}, {}} {
					g, err := v.Compile([]byte(schema), lim)
					if err != nil {
						t.Fatalf("Compile(%s): %v", schema, err)
					}
					m := g.NewMatcher()
					mask := make([]uint64, v.words)
					var out []byte
					for step := 0; step < 300 && !m.Done() && !m.Dead(); step++ {
						if checkLoop(t, m, rng, out) > 0 {
							loops++
						}
						m.FillMask(mask)
						id, ok := pick(mask, rng)
						if !ok {
							t.Fatalf("no token allowed after %q", out)
						}
						if err := m.Accept(id); err != nil {
							t.Fatalf("Accept(%d) after %q: %v", id, out, err)
						}
						if isEOS(v.eos, id) {
							break
						}
						out = append(out, v.pieces[id]...)
						total++
					}
				}
			}
			t.Logf("%d of %d states had a loop", loops, total)
			if loops < total/10 {
				t.Fatalf("only %d of %d states had a loop: the test exercises too few", loops, total)
			}
		})
	}
}

// BenchmarkLoop measures, inside a free string on the Llama 3 vocabulary,
// what a constrained step costs the host: filling the mask, and the loop
// beside it (a step whose token stayed in the loop skips both).
func BenchmarkLoop(b *testing.B) {
	v := realVocab(b, "llama3")
	g, err := v.Compile([]byte(`{"type":"object","properties":{"bio":{"type":"string"}},"required":["bio"]}`), Limits{})
	if err != nil {
		b.Fatal(err)
	}
	m := g.NewMatcher()
	if err := m.AcceptBytes([]byte(`{"bio":"Once upon a time`)); err != nil {
		b.Fatal(err)
	}
	mask := make([]uint64, v.words)
	loop := make([]uint64, v.words)
	if m.Loop(loop) == 0 {
		b.Fatal("no loop inside the string")
	}
	b.Run("FillMask", func(b *testing.B) {
		for b.Loop() {
			m.FillMask(mask)
		}
	})
	b.Run("Loop", func(b *testing.B) {
		steps := 0
		for b.Loop() {
			steps = m.Loop(loop)
		}
		n := 0
		for _, w := range loop {
			n += bits.OnesCount64(w)
		}
		b.ReportMetric(float64(steps), "steps")
		b.ReportMetric(float64(n), "loop-tokens")
	})
}

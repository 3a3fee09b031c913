package grammar

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// budgetDoc generates one document under a budget of budget tokens with
// uniformly random choices among the tokens FillMaskWithin allows, and
// with jump-forward (ForcedTokensWithin) when jump is set. It returns the
// text, which must be a complete document however the budget ended it,
// and the tokens the budget cut from masks.
func budgetDoc(t testing.TB, schema string, g *Grammar, rng *rand.Rand, budget int, jump bool) (doc string, cuts int) {
	t.Helper()
	m := g.NewMatcher()
	mask := make([]uint64, g.Vocab().MaskWords())
	var out []byte
	n := 0
	for n < budget && !m.Done() {
		_, cut := m.FillMaskWithin(mask, budget-n)
		if cut {
			cuts++
		}
		id, ok := pick(mask, rng)
		if !ok {
			t.Fatalf("budget %d: no token allowed after %q", budget, out)
		}
		if err := m.Accept(id); err != nil {
			t.Fatalf("Accept(%d) after %q: %v", id, out, err)
		}
		n++
		if isEOS(g.v.eos, id) {
			break
		}
		out = append(out, g.v.pieces[id]...)
		if !jump {
			continue
		}
		for _, f := range m.ForcedTokensWithin(budget-n, budget-n) {
			if err := m.Accept(f); err != nil {
				t.Fatalf("Accept(forced %d) after %q: %v", f, out, err)
			}
			out = append(out, g.v.pieces[f]...)
			n++
		}
	}
	if n > budget {
		t.Fatalf("budget %d: %d tokens", budget, n)
	}
	if !m.CanEnd() {
		t.Fatalf("schema %s, budget %d (MinTokens %d): document not complete after %d tokens: %q", schema, budget, g.MinTokens(), n, out)
	}
	return string(out), cuts
}

// TestPropertyCloseWithinBudget: for random schemas and every budget from
// the grammar's MinTokens up, documents generated at random under
// FillMaskWithin (with jump-forward and without) are complete when the
// budget runs out, and validate.
func TestPropertyCloseWithinBudget(t *testing.T) {
	schemas := 40
	if testing.Short() {
		schemas = 12
	}
	for name, mk := range testVocabs {
		t.Run(name, func(t *testing.T) {
			v := mk(t)
			rng := rand.New(rand.NewPCG(38, uint64(len(name))))
			docs, cut := 0, 0
			for i := 0; i < schemas; i++ {
				defs := map[string]any{}
				s := randSchema(rng, 0, defs)
				if len(defs) > 0 {
					s = map[string]any{"$defs": defs, "anyOf": []any{s}}
				}
				raw, _ := json.Marshal(s)
				g, err := v.Compile(raw, Limits{MaxStringLength: 24, MaxItems: 4, MaxProperties: 4, MaxValues: 40})
				if err != nil {
					t.Fatalf("Compile(%s): %v", raw, err)
				}
				lo := g.MinTokens()
				if lo < 0 {
					t.Fatalf("schema %s: no closing run", raw)
				}
				val := validator(t, string(raw))
				for j := 0; j < 6; j++ {
					budget := max(1, lo+rng.IntN(12)*(1+j))
					doc, cuts := budgetDoc(t, string(raw), g, rng, budget, j%2 == 1)
					checkDoc(t, val, string(raw), doc)
					docs++
					if cuts > 0 {
						cut++
					}
				}
			}
			t.Logf("%d documents validated, %d closed by their budget", docs, cut)
		})
	}
}

// TestMinTokens: the shortest documents of simple schemas, in tokens of
// the byte vocabulary (whose longest pieces include `{"`, `":` and `"}`).
func TestMinTokens(t *testing.T) {
	v := byteVocab()
	for _, c := range []struct {
		schema string
		want   int
	}{
		{`{"type":"integer"}`, 1},
		{`{"type":"string"}`, 1}, // ""
		{`{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false}`, 5},
		{`{"type":"array","items":{"type":"integer"},"minItems":3}`, 7},
		{`{"type":"boolean"}`, 1},
	} {
		g, err := v.Compile([]byte(c.schema), Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if got := g.MinTokens(); got != c.want {
			t.Errorf("%s: MinTokens %d, want %d", c.schema, got, c.want)
		}
	}
}

// TestFillMaskWithinKeyCommit: a token inside a key that picks an
// optional property (here "0" after `"p`, choosing p0_optional_and_long
// and its const object over the required p2_é) adds the rest of the key
// and the property's whole value to the closing distance at once;
// FillMaskWithin must not allow it when that leaves the document
// unclosable within the budget (it did, through a margin that counted
// the value alone).
func TestFillMaskWithinKeyCommit(t *testing.T) {
	schema := `{"type":"array","minItems":1,"items":{"type":"object","additionalProperties":false,"required":["p2_é"],"properties":{` +
		`"p0_optional_and_long":{"const":{"k":[1,"é"]}},"p1_x y":{"const":{"k":[1,"é"]}},"p2_é":{"type":"string","minLength":3,"maxLength":4}}}}`
	v := byteVocab()
	g, err := v.Compile([]byte(schema), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	prefix := []byte(`[{"p`)
	at := func() *Matcher {
		m := g.NewMatcher()
		if err := m.AcceptBytes(prefix); err != nil {
			t.Fatal(err)
		}
		return m
	}
	d := at().ClosingDistance()
	mask := make([]uint64, v.MaskWords())
	for budget := d; budget <= d+60; budget++ {
		at().FillMaskWithin(mask, budget)
		for id := range int32(len(v.pieces)) {
			if mask[id>>6]&(1<<(id&63)) == 0 || isEOS(v.eos, id) {
				continue
			}
			m := at()
			if err := m.Accept(id); err != nil {
				t.Fatalf("budget %d: allowed %q rejected: %v", budget, v.pieces[id], err)
			}
			if after := m.ClosingDistance(); after < 0 || after > budget-1 {
				t.Errorf("budget %d after %q (distance %d): %q allowed, after which the distance is %d", budget, prefix, d, v.pieces[id], after)
			}
		}
	}
}

package grammar

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// randBound is a bound for a random number schema: integers, halves,
// values with several fraction digits, either sign.
func randBound(rng *rand.Rand) float64 {
	switch rng.IntN(4) {
	case 0:
		return float64(rng.IntN(2001) - 1000)
	case 1:
		return float64(rng.IntN(41)-20) / 2
	case 2:
		return float64(rng.IntN(200001)-100000) / 1000
	}
	return []float64{0, 1, 100, -1, 0.5, 1e6, 99.99}[rng.IntN(7)]
}

// randNumberSchema is a number or integer schema with random bounds.
func randNumberSchema(rng *rand.Rand) map[string]any {
	s := map[string]any{"type": []string{"integer", "number"}[rng.IntN(2)]}
	a, b := randBound(rng), randBound(rng)
	lo, hi := min(a, b), max(a, b)
	if s["type"] == "integer" && int64(hi) == int64(lo) && lo != float64(int64(lo)) {
		hi = lo + 1
	}
	if hi == lo {
		hi++
	}
	switch rng.IntN(6) {
	case 0:
		s["minimum"] = lo
	case 1:
		s["maximum"] = hi
	case 2:
		s["minimum"], s["maximum"] = lo, hi
	case 3:
		s["exclusiveMinimum"], s["maximum"] = lo, hi
	case 4:
		s["minimum"], s["exclusiveMaximum"] = lo, hi
	}
	return s
}

// numberDocSchema holds a few numbers, alone, in an array, in an object
// and beside other alternatives.
func numberDocSchema(rng *rand.Rand) map[string]any {
	props := map[string]any{}
	for i := range 1 + rng.IntN(3) {
		var p map[string]any
		switch rng.IntN(4) {
		case 0:
			p = map[string]any{"type": "array", "items": randNumberSchema(rng), "minItems": 1, "maxItems": 3}
		case 1:
			p = map[string]any{"anyOf": []any{randNumberSchema(rng), randNumberSchema(rng), map[string]any{"type": "null"}}}
		case 2:
			p = map[string]any{"enum": []any{12, 3.5, "x"}}
		default:
			p = randNumberSchema(rng)
		}
		props[fmt.Sprintf("n%d", i)] = p
	}
	s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if rng.IntN(4) == 0 {
		return map[string]any{"type": "array", "items": s, "maxItems": 2}
	}
	return s
}

// TestDigitMaskEquivalence: on random schemas (those of the property
// test and number-heavy ones with random bounds and digit limits) and
// random documents, FillMask, which takes the digit tokens from lists
// and caches, sets exactly the tokens the trie walk alone sets, at
// every step.
func TestDigitMaskEquivalence(t *testing.T) {
	schemas := 40
	if testing.Short() {
		schemas = 10
	}
	for name, mk := range testVocabs {
		t.Run(name, func(t *testing.T) {
			v := mk(t)
			rng := rand.New(rand.NewPCG(23, uint64(len(name))))
			fast, ref := make([]uint64, v.MaskWords()), make([]uint64, v.MaskWords())
			steps, listed := 0, 0
			for i := range 2 * schemas {
				var s map[string]any
				lim := Limits{MaxStringLength: 24, MaxItems: 4, MaxProperties: 4, MaxValues: 40}
				if i%2 == 0 {
					defs := map[string]any{}
					s = randSchema(rng, 0, defs)
					if len(defs) > 0 {
						s = map[string]any{"$defs": defs, "anyOf": []any{s}}
					}
				} else {
					s = numberDocSchema(rng)
					lim.MaxIntDigits, lim.MaxFracDigits = 1+rng.IntN(8), 1+rng.IntN(4)
				}
				raw, _ := json.Marshal(s)
				g, err := v.Compile(raw, lim)
				if err != nil {
					t.Fatalf("Compile(%s): %v", raw, err)
				}
				for range 3 {
					m := g.NewMatcher()
					var out []byte
					for n := 0; n < 1500 && !m.Done(); n++ {
						m.FillMask(fast)
						m.fillMask(ref, false)
						if !slices.Equal(fast, ref) {
							t.Fatalf("schema %s after %q: FillMask and the walk differ: %s", raw, out, maskDiff(v, fast, ref))
						}
						steps++
						if m.digitMask(ref) {
							listed++
						}
						id, ok := pick(fast, rng)
						if !ok {
							break // digit limits below the bounds: a dead end, as both agree
						}
						if err := m.Accept(id); err != nil {
							t.Fatal(err)
						}
						if isEOS(v.eos, id) {
							break
						}
						out = append(out, v.pieces[id]...)
					}
				}
			}
			if listed == 0 {
				t.Fatal("no mask took its digit tokens from the lists")
			}
			t.Logf("%d masks equal, %d with digits from the lists", steps, listed)
		})
	}
}

// maskDiff names a few tokens set in one mask and not the other.
func maskDiff(v *Vocab, a, b []uint64) string {
	var only [2][]string
	for id := range v.size {
		x, y := a[id>>6]&(1<<(id&63)) != 0, b[id>>6]&(1<<(id&63)) != 0
		if x != y && len(only[0])+len(only[1]) < 12 {
			k := 0
			if y {
				k = 1
			}
			only[k] = append(only[k], fmt.Sprintf("%d:%q", id, v.pieces[id]))
		}
	}
	return fmt.Sprintf("only FillMask %v, only the walk %v", only[0], only[1])
}

package grammar

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
)

// randSchema builds a random schema from the supported subset.
func randSchema(rng *rand.Rand, depth int, defs map[string]any) map[string]any {
	k := rng.IntN(12)
	if depth >= 3 && k < 4 {
		k += 4
	}
	switch k {
	case 0, 1:
		props := map[string]any{}
		var req []any
		for i := 0; i < 1+rng.IntN(4); i++ {
			name := fmt.Sprintf("p%d_%s", i, []string{"a", "é", "q\"", "x y"}[rng.IntN(4)])
			props[name] = randSchema(rng, depth+1, defs)
			if rng.IntN(2) == 0 {
				req = append(req, name)
			}
		}
		s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
		if len(req) > 0 {
			s["required"] = req
		}
		return s
	case 2:
		s := map[string]any{"type": "array", "items": randSchema(rng, depth+1, defs)}
		lo := rng.IntN(3)
		s["minItems"] = lo
		if rng.IntN(2) == 0 {
			s["maxItems"] = lo + rng.IntN(3)
		}
		return s
	case 3:
		alts := []any{}
		for i := 0; i < 2+rng.IntN(2); i++ {
			alts = append(alts, randSchema(rng, depth+1, defs))
		}
		return map[string]any{"anyOf": alts}
	case 4:
		s := map[string]any{"type": "string"}
		switch rng.IntN(5) {
		case 0:
			lo := rng.IntN(4)
			s["minLength"], s["maxLength"] = lo, lo+rng.IntN(6)
		case 1:
			s["pattern"] = []string{"^[a-c]+$", "^x[0-9]{2,3}$", "ab", "^(yes|no)$", "^é.$"}[rng.IntN(5)]
		case 2:
			s["format"] = []string{"date", "date-time", "uuid", "email", "ipv4", "time"}[rng.IntN(6)]
		}
		return s
	case 5:
		s := map[string]any{"type": []string{"integer", "number"}[rng.IntN(2)]}
		if rng.IntN(2) == 0 {
			lo := rng.IntN(200) - 100
			s["minimum"] = lo
			s["maximum"] = lo + rng.IntN(50)
			if rng.IntN(3) == 0 {
				s["exclusiveMaximum"] = lo + 60
				delete(s, "maximum")
			}
		}
		return s
	case 6:
		return map[string]any{"enum": []any{"a", 1.5, nil, true, []any{1, "x"}, "line\nbreak"}[:1+rng.IntN(6)]}
	case 7:
		return map[string]any{"const": map[string]any{"k": []any{1, "é"}}}
	case 8:
		return map[string]any{"type": []string{"boolean", "null"}[rng.IntN(2)]}
	case 9:
		name := fmt.Sprintf("d%d", len(defs))
		defs[name] = true // reserved: nested definitions get other names
		defs[name] = randSchema(rng, depth+1, defs)
		return map[string]any{"$ref": "#/$defs/" + name}
	case 10:
		return map[string]any{"type": "object", "additionalProperties": randSchema(rng, depth+1, defs), "maxProperties": 1 + rng.IntN(3)}
	}
	return map[string]any{}
}

// TestPropertyRandomSchemas: for random schemas and uniformly random
// choices among allowed tokens (a model with random weights), every
// document finishes within the token cap, is JSON and validates, with
// jump-forward decoding (Matcher.ForcedTokens) as without.
func TestPropertyRandomSchemas(t *testing.T) {
	schemas := 60
	if testing.Short() {
		schemas = 15
	}
	for name, mk := range testVocabs {
		t.Run(name, func(t *testing.T) {
			v := mk(t)
			rng := rand.New(rand.NewPCG(11, uint64(len(name))))
			docs := 0
			for i := 0; i < schemas; i++ {
				defs := map[string]any{}
				s := randSchema(rng, 0, defs)
				if len(defs) > 0 {
					s = map[string]any{"allOf": nil, "$defs": defs, "anyOf": []any{s}}
					delete(s, "allOf")
				}
				raw, _ := json.Marshal(s)
				g, err := v.Compile(raw, Limits{MaxStringLength: 24, MaxItems: 4, MaxProperties: 4, MaxValues: 40})
				if err != nil {
					t.Fatalf("Compile(%s): %v", raw, err)
				}
				val := validator(t, string(raw))
				t.Logf("schema %s", raw)
				for j := 0; j < 4; j++ {
					doc, _ := sampleDoc(t, g, rng, 1500)
					checkDoc(t, val, string(raw), doc)
					docs++
				}
				// Jump-forward decoding (on the vocabularies with a
				// tokenizer): forced runs appended after each sample.
				for j := 0; j < 2; j++ {
					doc, _, _ := jumpDoc(t, g, rng, 1500)
					checkDoc(t, val, string(raw), doc)
					docs++
				}
			}
			t.Logf("%d documents over %d random schemas validated", docs, schemas)
		})
	}
}

package grammar

import (
	"math/rand/v2"
	"testing"
)

func TestFixedSchemasRealVocab(t *testing.T) {
	for _, name := range []string{"llama3", "qwen3", "llama2"} {
		t.Run(name, func(t *testing.T) {
			v := realVocab(t, name)
			rng := rand.New(rand.NewPCG(3, uint64(len(name))))
			for _, schema := range fixedSchemas {
				g, err := v.Compile([]byte(schema), Limits{})
				if err != nil {
					t.Fatalf("Compile(%s): %v", schema, err)
				}
				val := validator(t, schema)
				for i := 0; i < 5; i++ {
					doc, _ := sampleDoc(t, g, rng, 4000)
					checkDoc(t, val, schema, doc)
				}
			}
		})
	}
}

// TestJSONObjectEndsRealVocab: with the default limits, a model sampling
// uniformly among the allowed tokens of the Llama 3 vocabulary ends every
// json_object within 256 tokens (Limits.MaxFreeTokens), and the documents
// are JSON objects. It also shows the budget is what ends them: without
// it some document runs past 256 tokens.
func TestJSONObjectEndsRealVocab(t *testing.T) {
	v := realVocab(t, "llama3")
	val := validator(t, string(AnyObject))
	run := func(lim Limits, docs int) (longest int) {
		g, err := v.Compile(AnyObject, lim)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(11, uint64(lim.MaxFreeTokens)))
		for range docs {
			doc, n := sampleDoc(t, g, rng, 4000)
			checkDoc(t, val, string(AnyObject), doc)
			longest = max(longest, n)
		}
		return longest
	}
	n := run(Limits{}, 100)
	if n > 256 {
		t.Errorf("a json_object took %d tokens, want at most 256", n)
	}
	unbounded := run(Limits{MaxFreeTokens: 100000}, 20)
	if unbounded <= 256 {
		t.Errorf("without the budget the longest document took %d tokens: the test does not exercise it", unbounded)
	}
	t.Logf("longest json_object: %d tokens (%d without the budget)", n, unbounded)
}

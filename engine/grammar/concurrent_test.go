package grammar

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestConcurrentMatchers: matchers of one grammar (and compiles of the
// same schema) run at once on a shared vocabulary, whose lazy caches
// (string classifications, pattern states, the DFA) fill concurrently.
func TestConcurrentMatchers(t *testing.T) {
	v := byteVocab()
	schema := fixedSchemas[5] // formats: patterns and their caches
	val := validator(t, schema)
	for w := 0; w < 8; w++ {
		t.Run(fmt.Sprint(w), func(t *testing.T) {
			t.Parallel()
			g, err := v.Compile([]byte(schema), Limits{})
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for i := 0; i < 10; i++ {
				doc, _ := sampleDoc(t, g, rng, 20000)
				checkDoc(t, val, schema, doc)
			}
		})
	}
}

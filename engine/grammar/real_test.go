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

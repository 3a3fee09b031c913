package batcher_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/engine/grammar"
	"github.com/mlxserving/mlxserving/engine/tokenizer"
	"github.com/mlxserving/mlxserving/scheduler"
)

// BenchmarkConstrainedServing measures what constrained decoding costs the
// serving loop: 32 sequences generate JSON under a schema on the simulated
// engine (zero step time) with the real Llama 3 vocabulary, against the
// same run unconstrained. Reported per generated token.
func BenchmarkConstrainedServing(b *testing.B) {
	root := os.Getenv("MLXSERVING_TOKENIZERS")
	if root == "" {
		b.Skip("MLXSERVING_TOKENIZERS is not set: source scripts/setup.d/20-tokenizers.sh")
	}
	tok, err := tokenizer.Load(filepath.Join(root, "@lenml", "tokenizer-llama3", "models"))
	if err != nil {
		b.Fatal(err)
	}
	pieces := make([][]byte, tok.VocabSize())
	for id := range pieces {
		pieces[id] = tok.TokenBytes(int32(id))
	}
	v := grammar.NewVocab(pieces, tok.EOS(), tok.IsSpecial)
	schema := `{"type":"object","properties":{"name":{"type":"string","maxLength":40},"age":{"type":"integer","minimum":0,"maximum":120},"tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":4},"email":{"type":"string","format":"email"}},"required":["name","age","tags","email"],"additionalProperties":false}`
	g, err := v.Compile([]byte(schema), grammar.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	for _, constrained := range []bool{false, true} {
		name := "unconstrained"
		if constrained {
			name = "constrained"
		}
		b.Run(name, func(b *testing.B) {
			sim, err := enginetest.NewSim(enginetest.WithVocabSize(tok.VocabSize()), enginetest.WithEOS(tok.EOS()...), enginetest.WithMaxBatch(32))
			if err != nil {
				b.Fatal(err)
			}
			defer sim.Close()
			m, err := sim.Load(context.Background(), engine.ModelSpec{ID: "sim"})
			if err != nil {
				b.Fatal(err)
			}
			q, _ := scheduler.New[*batcher.Sequence]()
			bt, err := batcher.New(m, q)
			if err != nil {
				b.Fatal(err)
			}
			defer q.Close()
			defer bt.Close()
			tokens := 0
			start := time.Now()
			for i := 0; i < b.N; i++ {
				var wg sync.WaitGroup
				var mu sync.Mutex
				for k := 0; k < 32; k++ {
					s := &batcher.Sequence{Prompt: prompt(i*32+k, 8), MaxTokens: 120, IgnoreEOS: !constrained}
					s.Params.Temperature, s.Params.Seed, s.Params.HasSeed = 1, uint64(i*32+k), true
					if constrained {
						s.Constraint = g.NewMatcher()
					}
					if err := q.Push(&batcher.Entry{Value: s, Tier: api.Normal, Cost: 128}); err != nil {
						b.Fatal(err)
					}
					wg.Go(func() {
						r := collect(s)
						mu.Lock()
						tokens += len(r.tokens)
						mu.Unlock()
					})
				}
				wg.Wait()
			}
			el := time.Since(start)
			b.ReportMetric(float64(el.Nanoseconds())/1e3/float64(tokens), "µs/token")
			b.ReportMetric(float64(tokens)/float64(b.N*32), "tokens/seq")
		})
	}
}

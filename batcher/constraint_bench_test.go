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
// serving loop: 32 sequences generate JSON under a six-key object schema
// (two schemas) on the simulated engine (zero step time, and 2 ms a step
// as a small model's forward pass) with the real Llama 3 vocabulary,
// against the same run unconstrained, and with jump-forward decoding off
// and on. Reported per generated token, with the forward
// passes (samples) and the batched engine steps per document.
func BenchmarkConstrainedServing(b *testing.B) {
	root := os.Getenv("MLXSERVING_TOKENIZERS")
	if root == "" {
		b.Skip("MLXSERVING_TOKENIZERS is not set: source scripts/setup.d/20-tokenizers.sh")
	}
	tok, err := tokenizer.Load(filepath.Join(root, "@lenml", "tokenizer-llama3", "models"))
	if err != nil {
		b.Fatal(err)
	}
	v := grammar.VocabFromTokenizer(tok, 0)
	// person has free strings that a random model runs to their bounds;
	// ticket is mostly structure (enums, a boolean, bounded integers).
	schemas := map[string]string{
		"person": `{"type":"object","properties":{"name":{"type":"string","maxLength":40},"age":{"type":"integer","minimum":0,"maximum":120},"status":{"enum":["active","inactive","suspended"]},"role":{"enum":["administrator","editor","viewer"]},"tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":4},"email":{"type":"string","format":"email"}},"required":["name","age","status","role","tags","email"],"additionalProperties":false}`,
		"ticket": `{"type":"object","properties":{"category":{"enum":["billing","technical_support","account_management"]},"priority":{"type":"integer","minimum":1,"maximum":5},"sentiment":{"enum":["positive","neutral","negative"]},"escalate":{"type":"boolean"},"language":{"enum":["english","german","japanese"]},"summary":{"type":"string","maxLength":24}},"required":["category","priority","sentiment","escalate","language","summary"],"additionalProperties":false}`,
	}
	grammars := map[string]*grammar.Grammar{}
	for name, schema := range schemas {
		g, err := v.Compile([]byte(schema), grammar.Limits{})
		if err != nil {
			b.Fatal(err)
		}
		grammars[name] = g
	}
	runs := []struct {
		name   string
		schema string // "": unconstrained
		jump   bool
		step   time.Duration // the simulated forward pass
	}{
		{"unconstrained", "", false, 0},
		{"person", "person", false, 0},
		{"person-jump-forward", "person", true, 0},
		{"ticket", "ticket", false, 0},
		{"ticket-jump-forward", "ticket", true, 0},
		{"ticket-step2ms", "ticket", false, 2 * time.Millisecond},
		{"ticket-step2ms-jump-forward", "ticket", true, 2 * time.Millisecond},
	}
	for _, run := range runs {
		b.Run(run.name, func(b *testing.B) {
			sim, err := enginetest.NewSim(enginetest.WithVocabSize(tok.VocabSize()), enginetest.WithEOS(tok.EOS()...), enginetest.WithMaxBatch(32), enginetest.WithStepTime(run.step, 0))
			if err != nil {
				b.Fatal(err)
			}
			defer sim.Close()
			m, err := sim.Load(context.Background(), engine.ModelSpec{ID: "sim"})
			if err != nil {
				b.Fatal(err)
			}
			q, _ := scheduler.New[*batcher.Sequence]()
			bt, err := batcher.New(m, q, batcher.WithJumpForward(run.jump))
			if err != nil {
				b.Fatal(err)
			}
			defer q.Close()
			defer bt.Close()
			tokens, forced := 0, 0
			start := time.Now()
			for i := 0; i < b.N; i++ {
				var wg sync.WaitGroup
				var mu sync.Mutex
				for k := 0; k < 32; k++ {
					s := &batcher.Sequence{Prompt: prompt(i*32+k, 8), MaxTokens: 120, IgnoreEOS: run.schema == ""}
					s.Params.Temperature, s.Params.Seed, s.Params.HasSeed = 1, uint64(i*32+k), true
					if run.schema != "" {
						s.Constraint = grammars[run.schema].NewMatcher()
						s.MaxTokens = 400 // the document ends itself
					}
					if err := q.Push(&batcher.Entry{Value: s, Tier: api.Normal, Cost: 128}); err != nil {
						b.Fatal(err)
					}
					wg.Go(func() {
						r := collect(s)
						mu.Lock()
						tokens += len(r.tokens)
						if r.usage != nil {
							forced += r.usage.ForcedTokens
						}
						mu.Unlock()
					})
				}
				wg.Wait()
			}
			el := time.Since(start)
			docs := float64(b.N * 32)
			st := sim.Stats()
			b.ReportMetric(float64(el.Nanoseconds())/1e3/float64(tokens), "µs/token")
			b.ReportMetric(float64(tokens)/el.Seconds(), "tokens/s")
			b.ReportMetric(docs/el.Seconds(), "docs/s")
			b.ReportMetric(float64(tokens)/docs, "tokens/seq")
			b.ReportMetric(float64(forced)/docs, "forced/seq")
			b.ReportMetric(float64(st.Sampled)/docs, "passes/seq")
			b.ReportMetric(float64(st.Steps)/float64(b.N), "steps/32seq")
		})
	}
}

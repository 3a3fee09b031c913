package grammar

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"
)

// realisticSchema is an order record of the kind structured-output users
// send: nested objects, an array of items, enums, formats, bounds.
const realisticSchema = `{
  "type": "object",
  "properties": {
    "order_id": {"type": "string", "format": "uuid"},
    "customer": {
      "type": "object",
      "properties": {
        "name": {"type": "string"},
        "email": {"type": "string", "format": "email"},
        "tier": {"enum": ["free", "pro", "enterprise"]}
      },
      "required": ["name", "email", "tier"],
      "additionalProperties": false
    },
    "items": {
      "type": "array",
      "items": {
        "type": "object",
        "properties": {
          "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
          "quantity": {"type": "integer", "minimum": 1, "maximum": 100},
          "price": {"type": "number", "minimum": 0},
          "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}
        },
        "required": ["sku", "quantity", "price", "note"],
        "additionalProperties": false
      },
      "minItems": 1,
      "maxItems": 5
    },
    "paid": {"type": "boolean"},
    "created": {"type": "string", "format": "date-time"}
  },
  "required": ["order_id", "customer", "items", "paid", "created"],
  "additionalProperties": false
}`

// benchSchemas are the schemas BenchmarkMask and BenchmarkMaskCold run.
var benchSchemas = []struct{ name, schema string }{{"order", realisticSchema}, {"json_object", string(AnyObject)}}

// BenchmarkMask measures FillMask per generated token on real
// vocabularies, sampling uniformly among allowed tokens (the worst case:
// a random model fills strings to their bounds), after 20 warm-up
// documents. It reports the p50 and p99 of the per-token cost.
func BenchmarkMask(b *testing.B) {
	for _, name := range []string{"llama3", "qwen3"} {
		for _, sc := range benchSchemas {
			b.Run(name+"/"+sc.name, func(b *testing.B) {
				v := realVocab(b, name)
				g, err := v.Compile([]byte(sc.schema), Limits{MaxValues: 64})
				if err != nil {
					b.Fatal(err)
				}
				rng := rand.New(rand.NewPCG(7, 7))
				mask := make([]uint64, v.MaskWords())
				// Warm-up: what the first documents still build (the
				// per-trie-node string classes); their worst step is
				// reported as cold-max.
				times, _ := maskDocs(b, g, rng, mask, 20, nil)
				cold := slices.Max(times)
				b.ResetTimer()
				times, tokens := maskDocs(b, g, rng, mask, b.N, times[:0])
				b.StopTimer()
				b.ReportMetric(float64(cold.Microseconds()), "cold-max-µs")
				reportTimes(b, times, tokens)
			})
		}
	}
}

// BenchmarkMaskWithin is BenchmarkMask with FillMaskWithin: "far" under
// a budget no document reaches (the cost of knowing the closing distance
// at every step), "tight" under MinTokens+24 tokens a document, so that
// every document is closed by its budget (the steps near the end check
// every token the mask allows).
func BenchmarkMaskWithin(b *testing.B) {
	for _, name := range []string{"llama3", "qwen3"} {
		for _, sc := range benchSchemas {
			for _, mode := range []string{"far", "tight"} {
				b.Run(name+"/"+sc.name+"/"+mode, func(b *testing.B) {
					v := realVocab(b, name)
					maxValues := 64 // far shares BenchmarkMask's grammar
					if mode == "tight" {
						maxValues = 65 // a grammar of its own (the cache keys on limits)
					}
					g, err := v.Compile([]byte(sc.schema), Limits{MaxValues: maxValues})
					if err != nil {
						b.Fatal(err)
					}
					lo := g.MinTokens()
					budget := 1 << 20
					if mode == "tight" {
						budget = lo + 24
					}
					rng := rand.New(rand.NewPCG(7, 7))
					mask := make([]uint64, v.MaskWords())
					times, _ := budgetDocs(b, g, rng, mask, 20, nil, budget)
					b.ResetTimer()
					times, tokens := budgetDocs(b, g, rng, mask, b.N, times[:0], budget)
					b.StopTimer()
					b.ReportMetric(float64(lo), "min-tokens")
					reportTimes(b, times, tokens)
				})
			}
		}
	}
}

// BenchmarkMaskCold is BenchmarkMask for the first b.N documents after
// the vocabulary is prepared, with no warm-up: what a server's first
// requests meet. Each document compiles its schema first, as each request
// does; compile-ms is the first compile and max-compile-ms the slowest,
// warming included.
func BenchmarkMaskCold(b *testing.B) {
	for _, name := range []string{"llama3", "qwen3"} {
		for _, sc := range benchSchemas {
			b.Run(name+"/"+sc.name, func(b *testing.B) {
				shared := realVocab(b, name)
				v := NewVocab(shared.pieces, shared.eos, nil)
				rng := rand.New(rand.NewPCG(7, 7))
				mask := make([]uint64, v.MaskWords())
				var times []time.Duration
				var first, worst time.Duration
				tokens := 0
				b.ResetTimer()
				for i := range b.N {
					// Every request compiles its schema, as the server does:
					// the first compiles, the later ones hit the cache and go
					// on warming within the budget.
					t0 := time.Now()
					g, err := v.Compile([]byte(sc.schema), Limits{MaxValues: 64})
					if err != nil {
						b.Fatal(err)
					}
					d := time.Since(t0)
					if i == 0 {
						first = d
					}
					worst = max(worst, d)
					var n int
					times, n = maskDocs(b, g, rng, mask, 1, times)
					tokens += n
				}
				b.StopTimer()
				b.ReportMetric(float64(first.Microseconds())/1e3, "compile-ms")
				b.ReportMetric(float64(worst.Microseconds())/1e3, "max-compile-ms")
				reportTimes(b, times, tokens)
			})
		}
	}
}

// BenchmarkMaskNumber measures FillMask at the number positions of order
// documents (a number about to begin or going on), after the grammar has
// seen them once: the steps the digit lists serve.
func BenchmarkMaskNumber(b *testing.B) {
	for _, name := range []string{"llama3", "qwen3"} {
		b.Run(name, func(b *testing.B) {
			v := realVocab(b, name)
			g, err := v.Compile([]byte(realisticSchema), Limits{MaxValues: 64})
			if err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(7, 7))
			mask := make([]uint64, v.MaskWords())
			var at [][]*stk
			for range 30 {
				m := g.NewMatcher()
				for !m.Done() {
					if f := &m.states[0].f; f.kind == fNumber || f.kind == fValue && (f.n.kind == kNumber || f.n.kind == kInteger) {
						at = append(at, m.states)
					}
					m.FillMask(mask)
					id, _ := pick(mask, rng)
					if err := m.Accept(id); err != nil || isEOS(v.eos, id) {
						break
					}
				}
			}
			m := g.NewMatcher()
			b.ResetTimer()
			for i := range b.N {
				m.states = at[i%len(at)]
				m.FillMask(mask)
			}
		})
	}
}

// BenchmarkFirstNumberMask measures compiling a schema with one integer
// in 1..100 (the cache bypassed by varying the limits) and the new
// grammar's first mask at the integer, with the matcher's arena in place:
// what the first document of a schema pays at its first number.
func BenchmarkFirstNumberMask(b *testing.B) {
	v := realVocab(b, "llama3")
	const schema = `{"type":"object","properties":{"q":{"type":"integer","minimum":1,"maximum":100}},"required":["q"]}`
	mask := make([]uint64, v.MaskWords())
	var compiles, masks []time.Duration
	for i := range b.N {
		t0 := time.Now()
		g, err := v.Compile([]byte(schema), Limits{MaxValues: 1000 + i})
		if err != nil {
			b.Fatal(err)
		}
		compiles = append(compiles, time.Since(t0))
		m := g.NewMatcher()
		m.w.arena = [][]stk{make([]stk, arenaChunk)}
		if err := m.AcceptBytes([]byte(`{"q":`)); err != nil {
			b.Fatal(err)
		}
		t0 = time.Now()
		m.FillMask(mask)
		masks = append(masks, time.Since(t0))
	}
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Nanoseconds()) / 1e3
	}
	b.ReportMetric(median(compiles), "compile-µs")
	b.ReportMetric(median(masks), "first-mask-µs")
}

// maskDocs generates docs documents, appending the time of every
// FillMask to times; it returns them and the tokens generated.
func maskDocs(b *testing.B, g *Grammar, rng *rand.Rand, mask []uint64, docs int, times []time.Duration) ([]time.Duration, int) {
	return budgetDocs(b, g, rng, mask, docs, times, 0)
}

// budgetDocs is maskDocs with FillMaskWithin under a budget of budget
// tokens a document, or FillMask for budget 0.
func budgetDocs(b *testing.B, g *Grammar, rng *rand.Rand, mask []uint64, docs int, times []time.Duration, budget int) ([]time.Duration, int) {
	tokens := 0
	for range docs {
		m := g.NewMatcher()
		for n := 0; !m.Done() && (budget == 0 || n < budget); n++ {
			t0 := time.Now()
			if budget == 0 {
				m.FillMask(mask)
			} else {
				m.FillMaskWithin(mask, budget-n)
			}
			times = append(times, time.Since(t0))
			id, ok := pick(mask, rng)
			if !ok {
				b.Fatal("dead end")
			}
			if err := m.Accept(id); err != nil {
				b.Fatal(err)
			}
			tokens++
			if isEOS(g.v.eos, id) {
				break
			}
		}
	}
	return times, tokens
}

// reportTimes reports the p50, p99 and max of times and the tokens per
// document.
func reportTimes(b *testing.B, times []time.Duration, tokens int) {
	slices.Sort(times)
	q := func(p float64) float64 { return float64(times[int(p*float64(len(times)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(q(0.5), "p50-µs/token")
	b.ReportMetric(q(0.99), "p99-µs/token")
	b.ReportMetric(q(1), "max-µs/token")
	b.ReportMetric(float64(tokens)/float64(b.N), "tokens/doc")
}

// BenchmarkMinTokens measures the first MinTokens of a fresh grammar of
// the realistic schema (the cache is bypassed by varying the limits): the
// closing runs of its start and of every schema node (FillMaskWithin's
// margin), what the first budget-checked request computes.
func BenchmarkMinTokens(b *testing.B) {
	for _, name := range []string{"llama3", "qwen3"} {
		b.Run(name, func(b *testing.B) {
			v := realVocab(b, name)
			var d time.Duration
			for i := 0; i < b.N; i++ {
				g, err := v.Compile([]byte(realisticSchema), Limits{MaxValues: 2000 + i})
				if err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				g.MinTokens()
				g.openMargin()
				d += time.Since(t0)
			}
			b.ReportMetric(float64(d.Microseconds())/1e3/float64(b.N), "close-ms")
		})
	}
}

// BenchmarkCompile measures compiling the realistic schema (the cache is
// bypassed by varying the limits) and the heap it keeps.
func BenchmarkCompile(b *testing.B) {
	for _, name := range []string{"llama3", "qwen3"} {
		b.Run(name, func(b *testing.B) {
			v := realVocab(b, name)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			keep := make([]*Grammar, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				g, err := v.Compile([]byte(realisticSchema), Limits{MaxValues: 1000 + i})
				if err != nil {
					b.Fatal(err)
				}
				keep = append(keep, g)
			}
			b.StopTimer()
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(len(keep)), "heap-B/schema")
			runtime.KeepAlive(keep)
		})
	}
}

// BenchmarkVocab measures preparing a vocabulary (once per tokenizer).
func BenchmarkVocab(b *testing.B) {
	for _, name := range []string{"llama3", "qwen3"} {
		b.Run(name, func(b *testing.B) {
			v := realVocab(b, name)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			var keep *Vocab
			for i := 0; i < b.N; i++ {
				keep = NewVocab(v.pieces, v.eos, nil)
			}
			b.StopTimer()
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/1e6, "heap-MB")
			runtime.KeepAlive(keep)
		})
	}
}

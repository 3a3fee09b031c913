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

// BenchmarkMask measures FillMask per generated token on real
// vocabularies, sampling uniformly among allowed tokens (the worst case:
// a random model fills strings to their bounds). It reports the p50 and
// p99 of the per-token cost.
func BenchmarkMask(b *testing.B) {
	for _, name := range []string{"llama3", "qwen3"} {
		for _, sc := range []struct{ name, schema string }{{"order", realisticSchema}, {"json_object", string(AnyObject)}} {
			b.Run(name+"/"+sc.name, func(b *testing.B) {
				v := realVocab(b, name)
				g, err := v.Compile([]byte(sc.schema), Limits{MaxValues: 64})
				if err != nil {
					b.Fatal(err)
				}
				rng := rand.New(rand.NewPCG(7, 7))
				mask := make([]uint64, v.MaskWords())
				var times []time.Duration
				tokens := 0
				doc := func() {
					m := g.NewMatcher()
					for !m.Done() {
						t0 := time.Now()
						m.FillMask(mask)
						times = append(times, time.Since(t0))
						id, ok := pick(mask, rng)
						if !ok {
							b.Fatal("dead end")
						}
						if err := m.Accept(id); err != nil {
							b.Fatal(err)
						}
						tokens++
						if isEOS(v.eos, id) {
							break
						}
					}
				}
				// Warm-up: the first documents build the per-pattern-state
				// caches (once per process and vocabulary); their worst
				// step is reported as cold-max.
				for i := 0; i < 20; i++ {
					doc()
				}
				var cold time.Duration
				for _, d := range times {
					cold = max(cold, d)
				}
				times, tokens = times[:0], 0
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					doc()
				}
				b.StopTimer()
				b.ReportMetric(float64(cold.Microseconds()), "cold-max-µs")
				slices.Sort(times)
				q := func(p float64) float64 { return float64(times[int(p*float64(len(times)-1))].Nanoseconds()) / 1e3 }
				b.ReportMetric(q(0.5), "p50-µs/token")
				b.ReportMetric(q(0.99), "p99-µs/token")
				b.ReportMetric(q(1), "max-µs/token")
				b.ReportMetric(float64(tokens)/float64(b.N), "tokens/doc")
			})
		}
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

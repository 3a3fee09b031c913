package pyproc

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// The constrained-decoding benchmarks run on the tiny model, or with
// MLXSERVING_BENCH_SHAPE=llama1b (or llama8b) on a random checkpoint of
// that shape (128k vocabulary), written once per test binary; with
// MLXSERVING_TEST_DEVICE=cuda on the GPU:
//
//	go test -c -o pyproc.test ./engine/pyproc
//	MLXSERVING_PYTHON=python3 MLXSERVING_TEST_DEVICE=cuda MLXSERVING_BENCH_SHAPE=llama1b \
//	  ./pyproc.test -test.run '^$' -test.bench 'Constrained|MaskStep' -test.benchtime 3x

var (
	shapeOnce sync.Once
	shapeDir  string
	shapeErr  error
)

func benchModel(b *testing.B) string {
	name := os.Getenv("MLXSERVING_BENCH_SHAPE")
	if name == "" {
		return tiny(b)
	}
	mk, ok := testmodel.Shapes()[name]
	if !ok {
		b.Fatalf("MLXSERVING_BENCH_SHAPE=%q: not a testmodel shape", name)
	}
	shapeOnce.Do(func() {
		if shapeDir, shapeErr = os.MkdirTemp("", "pyproc-"+name+"-"); shapeErr == nil {
			cfg := mk()
			cfg.ContextLength = 4096
			shapeErr = testmodel.Write(shapeDir, cfg)
		}
	})
	if shapeErr != nil {
		b.Fatal(shapeErr)
	}
	return shapeDir
}

// constrainedSchema is mostly free strings, where the grammar loops.
const constrainedSchema = `{"type":"object","properties":{"name":{"type":"string"},"bio":{"type":"string"},` +
	`"notes":{"type":"array","items":{"type":"string"},"maxItems":3}},"required":["name","bio","notes"],"additionalProperties":false}`

var docParams = api.Params{MaxTokens: 200, JSONSchema: []byte(constrainedSchema)}

// BenchmarkConstrained generates documents of constrainedSchema through
// the whole stack (server, batcher with the grammar, pyproc), greedy, 1
// or 16 at once, with lookahead off and at 8 (the CUDA default): tokens/s,
// worker requests per token, and per-token latency.
func BenchmarkConstrained(b *testing.B) {
	for _, batch := range []int{1, 16} {
		for _, k := range []int{1, 8} {
			b.Run(fmt.Sprintf("batch=%d/lookahead=%d", batch, k), func(b *testing.B) {
				e := newEngine(b, WithLookahead(k))
				srv := newServer(b, e, engine.ModelSpec{ID: "m", Path: benchModel(b), MaxBatch: 32})
				p, err := e.slots[0].current(context.Background(), e.closing)
				if err != nil {
					b.Fatal(err)
				}
				serveAll(b, srv, "m", batch, docParams, true) // warm-up: compiles the grammar, captures graphs
				tokens, trips := 0, uint64(0)
				for b.Loop() {
					before := p.nextID.Load()
					tokens += serveAll(b, srv, "m", batch, docParams, true)
					trips += p.nextID.Load() - before
				}
				b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
				b.ReportMetric(float64(trips)/float64(tokens), "requests/token")
				b.ReportMetric(float64(b.Elapsed().Microseconds())*float64(batch)/float64(tokens), "µs/token/seq")
			})
		}
	}
}

// BenchmarkMaskStep measures what a mask adds to a decode step, lookahead
// off: the same greedy steps of 1 or 16 sequences without a mask, with
// the mask of a free string (nearly every token: the "d" form) and with
// a random half of the vocabulary (the base64 bitset). The difference in
// µs/token/seq between a masked run and the unmasked one is the mask's
// cost per token: encoding, the protocol, decoding and the batched fill.
func BenchmarkMaskStep(b *testing.B) {
	for _, batch := range []int{1, 16} {
		for _, kind := range []string{"none", "string", "half"} {
			b.Run(fmt.Sprintf("batch=%d/mask=%s", batch, kind), func(b *testing.B) {
				e := newEngine(b, WithLookahead(1))
				m := load(b, e, benchModel(b))
				v := m.Info().VocabSize
				var mask []uint64
				if kind != "none" {
					mask = make([]uint64, engine.MaskWords(v))
					for id := 0; id < v; id++ {
						if kind == "string" && id%97 != 0 || kind == "half" && (id*2654435761)>>7&1 == 0 {
							mask[id>>6] |= 1 << (id & 63)
						}
					}
				}
				ctx := context.Background()
				feeds := make([][]int32, batch)
				for i := range feeds {
					feeds[i] = openFeed(b, m, engine.SeqID(i+1), prompt(i, 16))
				}
				in := make([]engine.StepInput, batch)
				steps := 0
				var took time.Duration
				for b.Loop() {
					for i := range in {
						in[i] = engine.StepInput{Seq: engine.SeqID(i + 1), Tokens: feeds[i], Sample: true, Params: greedy, Allowed: mask}
					}
					t0 := time.Now()
					outs, err := m.Step(ctx, in)
					took += time.Since(t0)
					if err != nil {
						b.Fatal(err)
					}
					for i, o := range outs {
						feeds[i] = []int32{o.Token}
					}
					if steps++; steps%256 == 0 { // stay inside the context
						for i := range feeds {
							m.Free(engine.SeqID(i+1), "")
							feeds[i] = openFeed(b, m, engine.SeqID(i+1), prompt(i, 16))
						}
					}
				}
				b.ReportMetric(float64(took.Microseconds())/float64(steps*batch), "µs/token/seq")
			})
		}
	}
}

//go:build mlx

package mlx

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/pyproc"
	"github.com/mlxserving/mlxserving/testmodel"
)

// benchModels are the decode benchmark's checkpoints: the tiny test model
// and a ~100M-parameter Llama (12 layers, hidden 768, GQA 12/4 heads, MLP
// 2048, 32000 vocabulary, tied embeddings: 24.6M embedding + 75.5M layers).
var benchModels = []struct {
	name string
	cfg  testmodel.Config
}{
	{"tiny", testmodel.Tiny()},
	{"100M", testmodel.Config{Layers: 12, Hidden: 768, Heads: 12, KVHeads: 4, Intermediate: 2048,
		Vocab: 32000, ContextLength: 1024, TieEmbeddings: true}},
}

func benchDir(b *testing.B, cfg testmodel.Config) string {
	dir := b.TempDir()
	if err := testmodel.Write(dir, cfg); err != nil {
		b.Fatal(err)
	}
	return dir
}

// decodeBench decodes batch sequences for b.N steps, either in one Step per
// step or one Step per sequence ("serial"), and reports tokens/s.
func decodeBench(b *testing.B, m engine.Model, batch int, serial bool, p *engine.SamplingParams) {
	decodeBenchAdapters(b, m, batch, serial, p, nil)
}

// decodeBenchAdapters is decodeBench with sequence i opened with adapter
// adapters[i%len(adapters)] (empty: the base) when adapters is set.
func decodeBenchAdapters(b *testing.B, m engine.Model, batch int, serial bool, p *engine.SamplingParams, adapters []string) {
	ctx := context.Background()
	limit := m.Info().ContextLength - 8
	var next engine.SeqID
	ids := make([]engine.SeqID, batch)
	last := make([]int32, batch)
	pos := 0
	open := func() {
		for i := range ids {
			m.Free(ids[i], "")
			next++
			ids[i] = next
			prompt := []int32{1, int32(10 + i), 20, 30, 40, 50, 60, 70}
			var err error
			if len(adapters) > 0 {
				_, err = m.(engine.AdapterModel).OpenAdapter(ctx, ids[i], prompt, "", adapters[i%len(adapters)])
			} else {
				_, err = m.Open(ctx, ids[i], prompt, "")
			}
			if err != nil {
				b.Fatal(err)
			}
			out, err := m.Step(ctx, []engine.StepInput{{Seq: ids[i], Tokens: prompt, Sample: true}})
			if err != nil {
				b.Fatal(err)
			}
			last[i] = out[0].Token
		}
		pos = 8
	}
	open()
	defer func() {
		for _, id := range ids {
			m.Free(id, "")
		}
	}()
	in := make([]engine.StepInput, batch)
	b.ResetTimer()
	start := time.Now()
	for n := 0; n < b.N; n++ {
		if pos >= limit {
			b.StopTimer()
			open()
			b.StartTimer()
		}
		for i := range in {
			in[i] = engine.StepInput{Seq: ids[i], Tokens: last[i : i+1], Sample: true, Params: p}
		}
		if serial {
			for i := range in {
				out, err := m.Step(ctx, in[i:i+1])
				if err != nil {
					b.Fatal(err)
				}
				last[i] = out[0].Token
			}
		} else {
			out, err := m.Step(ctx, in)
			if err != nil {
				b.Fatal(err)
			}
			for i := range out {
				last[i] = out[i].Token
			}
		}
		pos++
	}
	el := time.Since(start)
	b.ReportMetric(float64(b.N*batch)/el.Seconds(), "tok/s")
	b.ReportMetric(float64(el.Microseconds())/1000/float64(b.N), "ms/step")
}

// BenchmarkStep measures the MLX engine's decode step on the tiny model at
// the GPU table's batch sizes (1, 8, 32, 64): greedy, and seeded sampling
// with temperature, top-k and top-p.
func BenchmarkStep(b *testing.B) {
	e, err := New(WithMaxBatch(64))
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	m, err := e.Load(context.Background(), engine.ModelSpec{ID: "tiny", Path: benchDir(b, testmodel.Tiny()), MaxBatch: 64})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	for _, batch := range []int{1, 8, 32, 64} {
		b.Run(fmt.Sprintf("greedy/batch=%d", batch), func(b *testing.B) { decodeBench(b, m, batch, false, nil) })
	}
	p := &engine.SamplingParams{Temperature: 0.8, TopK: 50, TopP: 0.9, Seed: 7, HasSeed: true}
	for _, batch := range []int{1, 8, 32, 64} {
		b.Run(fmt.Sprintf("sample/batch=%d", batch), func(b *testing.B) { decodeBench(b, m, batch, false, p) })
	}
}

// BenchmarkDecode measures decode tokens/s of the MLX engine, batched and
// one sequence at a time, and of the Python engine's torch backend on the
// same checkpoint when MLXSERVING_PYTHON is set.
func BenchmarkDecode(b *testing.B) {
	e, err := New(WithMaxBatch(16))
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	var py *pyproc.Engine
	if p := os.Getenv("MLXSERVING_PYTHON"); p != "" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		py, err = pyproc.New(ctx, pyproc.WithPython(p), pyproc.WithBackend("torch"), pyproc.WithDevice("cpu"), pyproc.WithCacheDir(b.TempDir()))
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		defer py.Close()
	}
	for _, bm := range benchModels {
		dir := benchDir(b, bm.cfg)
		m, err := e.Load(context.Background(), engine.ModelSpec{ID: bm.name, Path: dir, MaxBatch: 16})
		if err != nil {
			b.Fatal(err)
		}
		for _, batch := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("mlx/%s/batch=%d", bm.name, batch), func(b *testing.B) { decodeBench(b, m, batch, false, nil) })
			if batch > 1 {
				b.Run(fmt.Sprintf("mlx/%s/serial=%d", bm.name, batch), func(b *testing.B) { decodeBench(b, m, batch, true, nil) })
			}
		}
		m.Close()
		if py == nil {
			continue
		}
		pm, err := py.Load(context.Background(), engine.ModelSpec{ID: bm.name, Path: dir, MaxBatch: 16})
		if err != nil {
			b.Fatal(err)
		}
		for _, batch := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("pyproc-torch/%s/batch=%d", bm.name, batch), func(b *testing.B) { decodeBench(b, pm, batch, false, nil) })
		}
		pm.Close()
	}
}

// BenchmarkEmbed measures embedding throughput: steps of 16 inputs of
// 128 tokens each, every input whole in the step (mean pooling), on the
// tiny encoders and decoder and the bge-base and Qwen3-Embedding-0.6B
// shapes (random weights; minutes a step on a CPU). It reports
// vectors/s.
func BenchmarkEmbed(b *testing.B) {
	for _, c := range []struct {
		name string
		cfg  testmodel.Config
	}{
		{"bert-tiny", testmodel.TinyFamily("bert")},
		{"modernbert-tiny", testmodel.TinyFamily("modernbert")},
		{"qwen3-tiny", testmodel.TinyFamily("qwen3")},
		{"bge-base", testmodel.BGEBase()},
		{"qwen3-embedding-0.6b", testmodel.Qwen3Embedding06B()},
	} {
		b.Run(c.name, func(b *testing.B) {
			dir := benchDir(b, c.cfg)
			m, err := newEngine(b).Load(context.Background(), engine.ModelSpec{ID: c.name, Path: dir, MaxBatch: 16})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			benchEmbed(b, m, 16, 128)
		})
	}
}

// benchEmbed embeds batch inputs of n tokens per step, after one
// untimed step.
func benchEmbed(b *testing.B, m engine.Model, batch, n int) {
	ctx := context.Background()
	em := m.(engine.Embedder)
	vocab := int32(m.Info().VocabSize)
	in := make([]engine.StepInput, batch)
	var id engine.SeqID
	round := func() {
		for i := range in {
			id++
			toks := make([]int32, n)
			for j := range toks {
				toks[j] = (int32(id)*131 + int32(j)*37 + 11) % vocab
			}
			if err := em.OpenPooled(ctx, id, toks, engine.PoolMean); err != nil {
				b.Fatal(err)
			}
			in[i] = engine.StepInput{Seq: id, Tokens: toks, Sample: true}
		}
		out, err := m.Step(ctx, in)
		if err != nil {
			b.Fatal(err)
		}
		if len(out) != batch {
			b.Fatalf("%d vectors for %d inputs", len(out), batch)
		}
		for i := range in {
			m.Free(in[i].Seq, "")
		}
	}
	round() // MLX builds its kernels for the shapes first
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		round()
	}
	b.ReportMetric(float64(b.N*batch)/time.Since(start).Seconds(), "vectors/s")
}

// BenchmarkAdapterDecode measures batched decode (8 sequences) on a
// 4-layer, hidden-512 Llama with every sequence on the base, half of them
// on two rank-16 adapters of every projection, and all of them on the
// adapters: what the LoRA path adds to a step.
func BenchmarkAdapterDecode(b *testing.B) {
	e, err := New()
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	cfg := testmodel.Config{Layers: 4, Hidden: 512, Heads: 8, KVHeads: 4, Intermediate: 1408, Vocab: 4096, ContextLength: 512}
	dir := benchDir(b, cfg)
	m, err := e.Load(context.Background(), engine.ModelSpec{ID: "bench", Path: dir})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	am := m.(engine.AdapterModel)
	for i, name := range []string{"x", "y"} {
		ad := b.TempDir()
		if err := testmodel.WriteAdapter(ad, cfg, testmodel.Adapter{Rank: 16, Seed: int64(i)}); err != nil {
			b.Fatal(err)
		}
		if _, err := am.AddAdapter(context.Background(), engine.AdapterSpec{Name: name, Path: ad}); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []struct {
		name     string
		adapters []string
	}{{"base", nil}, {"half", []string{"", "x", "", "y"}}, {"all", []string{"x", "y"}}} {
		b.Run(c.name, func(b *testing.B) { decodeBenchAdapters(b, m, 8, false, nil, c.adapters) })
	}
}

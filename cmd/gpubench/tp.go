package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/pyproc"
)

// tpDType loads both engines in another dtype (float32: the greedy
// comparison without bf16's reordered sums).
var tpDType = flag.String("tp-dtype", "", "-tp: the weights' dtype for both engines (empty: the checkpoint's)")

// tpRounds is how many times the tensor-parallel comparison measures each
// batch size on each engine, alternating; the table gives the medians.
const tpRounds = 3

// tpMode compares tensor parallel -tp with one GPU on the checkpoint in
// -dir: both engines loaded side by side, the greedy tokens of a batch of
// sequences (the first position where they part, bf16 sums in another
// order may), then decode tokens/s at each -batches size, TP1 and TPn
// alternating, tpRounds times.
func tpMode(ctx context.Context, ranks int) error {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var sizes []int
	if *batches != "" {
		sizes = ints(*batches)
	}
	widest := slices.Max(append(slices.Clone(sizes), 8))
	open := func(n int) (*pyproc.Engine, *pyproc.Model, error) {
		opts := []pyproc.Option{pyproc.WithPython(*python), pyproc.WithDevice(*device), pyproc.WithLogger(logger),
			pyproc.WithCUDAGraphs(*graphs), pyproc.WithStartTimeout(5 * time.Minute), pyproc.WithLookahead(*lookahead), tuning()}
		if *tpDType != "" {
			opts = append(opts, pyproc.WithDType(*tpDType))
		}
		if n > 1 {
			opts = append(opts, pyproc.WithTensorParallel(n))
		}
		e, err := pyproc.New(ctx, opts...)
		if err != nil {
			return nil, nil, err
		}
		t0 := time.Now()
		m, err := e.Load(ctx, engine.ModelSpec{ID: fmt.Sprintf("tp%d", n), Path: *dir, ContextLength: 1024, MaxBatch: widest})
		if err != nil {
			_ = e.Close()
			return nil, nil, fmt.Errorf("tensor parallel %d: %w", n, err)
		}
		i := m.Info()
		fmt.Printf("tp %d loaded in %v: weights %.2f GB and KV %.2f GB per GPU, %d KV tokens\n", n, time.Since(t0).Round(time.Millisecond),
			float64(i.WeightBytes)/float64(max(1, i.TensorParallel))/1e9, float64(i.KVBytes)/float64(max(1, i.TensorParallel))/1e9, i.KVCapacity)
		return e, m.(*pyproc.Model), nil
	}
	e1, m1, err := open(1)
	if err != nil {
		return err
	}
	defer e1.Close()
	en, mn, err := open(ranks)
	if err != nil {
		return err
	}
	defer en.Close()

	const seqs = 8
	g1, gn := greedy(ctx, m1, seqs, *gen), greedy(ctx, mn, seqs, *gen)
	same := 0
	for i := range g1 {
		at := -1
		for j := range g1[i] {
			if g1[i][j] != gn[i][j] {
				at = j
				break
			}
		}
		if at < 0 {
			same++
			fmt.Printf("greedy seq %d: tp %d equals tp 1 for all %d tokens\n", i, ranks, len(g1[i]))
		} else {
			fmt.Printf("greedy seq %d: tp %d parts from tp 1 at generated position %d (%d vs %d)\n", i, ranks, at, gn[i][at], g1[i][at])
		}
	}
	fmt.Printf("greedy: %d of %d sequences identical over %d tokens\n", same, seqs, *gen)

	r1, rn := map[int][]float64{}, map[int][]float64{}
	for _, b := range sizes { // warm-up: the graphs the timed runs use
		decode(ctx, m1, b, 8)
		decode(ctx, mn, b, 8)
	}
	for range tpRounds {
		for _, b := range sizes {
			r1[b] = append(r1[b], decode(ctx, m1, b, *gen))
			rn[b] = append(rn[b], decode(ctx, mn, b, *gen))
		}
	}
	if len(sizes) > 0 {
		fmt.Printf("\ndecode: prompt %d, %d new tokens, greedy, CUDA graphs %v; median of %d alternating rounds\n", *prompt, *gen, *graphs, tpRounds)
		fmt.Printf("| batch | tp 1 tok/s | tp %d tok/s | tp %d / tp 1 |\n|---|---|---|---|\n", ranks, ranks)
		for _, b := range sizes {
			a, c := median(r1[b]), median(rn[b])
			fmt.Printf("| %d | %.1f | %.1f | %.2fx |\n", b, a, c, c/a)
		}
	}
	return nil
}

// greedy decodes n tokens for each of b sequences, batched, and returns
// each sequence's tokens.
func greedy(ctx context.Context, m *pyproc.Model, b, n int) [][]int32 {
	batch := make([]engine.StepInput, b)
	out := make([][]int32, b)
	p := &engine.SamplingParams{}
	for i := range batch {
		toks := promptFor(i, *prompt, m.Info().VocabSize)
		_, err := m.Open(ctx, engine.SeqID(1000+i), toks, "")
		must(err)
		batch[i] = engine.StepInput{Seq: engine.SeqID(1000 + i), Tokens: toks, Sample: true, Params: p}
	}
	for range n {
		outs, err := m.Step(ctx, batch)
		must(err)
		for i := range batch {
			out[i] = append(out[i], outs[i].Token)
			batch[i].Tokens = []int32{outs[i].Token}
		}
	}
	for i := range batch {
		m.Free(batch[i].Seq, "")
	}
	return out
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

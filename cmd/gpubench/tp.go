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

// tpBoth opens tensor parallel -tp twice, one-shot all-reduce on and off,
// beside the one GPU: the one-shot kernel against NCCL alone in one
// process, alternating, so both see the same GPUs at the same time.
var tpBoth = flag.Bool("tp-oneshot-both", false, "-tp: measure tensor parallel with the one-shot all-reduce and with NCCL alone, alternating")

// tpRounds is how many times the tensor-parallel comparison measures each
// batch size on each engine, alternating; the table gives the medians.
const tpRounds = 3

// tpMode compares tensor parallel -tp with one GPU on the checkpoint in
// -dir: the engines loaded side by side (with -tp-oneshot-both, tensor
// parallel twice), the greedy tokens of a batch of sequences (the first
// position where each parts from TP1, bf16 sums in another order may),
// then decode tokens/s at each -batches size, the engines alternating,
// tpRounds times.
func tpMode(ctx context.Context, ranks int) error {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var sizes []int
	if *batches != "" {
		sizes = ints(*batches)
	}
	widest := slices.Max(append(slices.Clone(sizes), 8))
	open := func(name string, n int, oneShot bool) (*pyproc.Engine, *pyproc.Model, error) {
		t := tuningValue()
		t.NoOneShotAllReduce = !oneShot
		opts := []pyproc.Option{pyproc.WithPython(*python), pyproc.WithDevice(*device), pyproc.WithLogger(logger),
			pyproc.WithCUDAGraphs(*graphs), pyproc.WithStartTimeout(5 * time.Minute), pyproc.WithLookahead(*lookahead), pyproc.WithTuning(t)}
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
		fmt.Printf("%s loaded in %v: weights %.2f GB and KV %.2f GB per GPU, %d KV tokens\n", name, time.Since(t0).Round(time.Millisecond),
			float64(i.WeightBytes)/float64(max(1, i.TensorParallel))/1e9, float64(i.KVBytes)/float64(max(1, i.TensorParallel))/1e9, i.KVCapacity)
		return e, m.(*pyproc.Model), nil
	}
	// The engines compared: one GPU first, then tensor parallel with the
	// one-shot all-reduce as -tp-oneshot says, then (-tp-oneshot-both)
	// with the other.
	type run struct {
		name string
		m    *pyproc.Model
		rate map[int][]float64
	}
	var runs []run
	var engines []*pyproc.Engine
	defer func() {
		for _, e := range engines {
			_ = e.Close()
		}
	}()
	add := func(name string, n int, oneShot bool) error {
		e, m, err := open(name, n, oneShot)
		if err != nil {
			return err
		}
		engines = append(engines, e)
		runs = append(runs, run{name, m, map[int][]float64{}})
		return nil
	}
	if err := add("tp 1", 1, false); err != nil {
		return err
	}
	tpName := func(oneShot bool) string {
		if oneShot {
			return fmt.Sprintf("tp %d one-shot", ranks)
		}
		return fmt.Sprintf("tp %d NCCL", ranks)
	}
	if err := add(tpName(*tpOneShot), ranks, *tpOneShot); err != nil {
		return err
	}
	if *tpBoth {
		if err := add(tpName(!*tpOneShot), ranks, !*tpOneShot); err != nil {
			return err
		}
	}

	const seqs = 8
	g1 := greedy(ctx, runs[0].m, seqs, *gen)
	for _, r := range runs[1:] {
		gn := greedy(ctx, r.m, seqs, *gen)
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
				fmt.Printf("greedy seq %d: %s equals tp 1 for all %d tokens\n", i, r.name, len(g1[i]))
			} else {
				fmt.Printf("greedy seq %d: %s parts from tp 1 at generated position %d (%d vs %d)\n", i, r.name, at, gn[i][at], g1[i][at])
			}
		}
		fmt.Printf("greedy: %s: %d of %d sequences identical to tp 1 over %d tokens\n", r.name, same, seqs, *gen)
	}

	for _, b := range sizes { // warm-up: the graphs the timed runs use
		for _, r := range runs {
			decode(ctx, r.m, b, 8)
		}
	}
	for range tpRounds {
		for _, b := range sizes {
			for _, r := range runs {
				r.rate[b] = append(r.rate[b], decode(ctx, r.m, b, *gen))
			}
		}
	}
	if len(sizes) > 0 {
		fmt.Printf("\ndecode: prompt %d, %d new tokens, greedy, CUDA graphs %v; median of %d alternating rounds\n", *prompt, *gen, *graphs, tpRounds)
		head, rule := "| batch |", "|---|"
		for _, r := range runs {
			head += " " + r.name + " tok/s |"
			rule += "---|"
		}
		for _, r := range runs[1:] {
			head += " " + r.name + " / tp 1 |"
			rule += "---|"
		}
		fmt.Println(head + "\n" + rule)
		for _, b := range sizes {
			row, base := fmt.Sprintf("| %d |", b), median(runs[0].rate[b])
			for _, r := range runs {
				row += fmt.Sprintf(" %.1f |", median(r.rate[b]))
			}
			for _, r := range runs[1:] {
				row += fmt.Sprintf(" %.2fx |", median(r.rate[b])/base)
			}
			fmt.Println(row)
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

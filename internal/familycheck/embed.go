package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/mlxserving/mlxserving/engine"
)

// embedRun embeds every input with each pooling (one batch per pooling:
// an encoder's inputs whole, a decoder's in chunks of chunk tokens) and
// prints {"mean": [[...]], "cls": ..., "lasttoken": ...} for
// hf_embed.py's compare.
func embedRun(ctx context.Context, m engine.Model, inputs [][]int32, chunk int) error {
	emb, ok := m.(engine.Embedder)
	if !ok || m.Info().EmbedDim == 0 {
		return errors.New("the model does not embed")
	}
	out := map[string][][]float32{}
	for _, pool := range []engine.Pooling{engine.PoolMean, engine.PoolCLS, engine.PoolLast} {
		vecs, err := embedAll(ctx, m, emb, inputs, pool, chunk)
		if err != nil {
			return fmt.Errorf("%v: %w", pool, err)
		}
		out[pool.String()] = vecs
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// embedAll embeds inputs as one batch, MaxBatch inputs a step at most.
func embedAll(ctx context.Context, m engine.Model, emb engine.Embedder, inputs [][]int32, pool engine.Pooling, chunk int) ([][]float32, error) {
	info := m.Info()
	if info.Encoder {
		chunk = info.ContextLength
	}
	vecs := make([][]float32, len(inputs))
	for lo := 0; lo < len(inputs); lo += info.MaxBatch {
		hi := min(len(inputs), lo+info.MaxBatch)
		for i := lo; i < hi; i++ {
			if err := emb.OpenPooled(ctx, engine.SeqID(i), inputs[i], pool); err != nil {
				return nil, fmt.Errorf("input %d (%d tokens): %w", i, len(inputs[i]), err)
			}
		}
		fed := make([]int, len(inputs))
		for done := lo; done < hi; {
			var batch []engine.StepInput
			for i := lo; i < hi; i++ {
				if fed[i] < len(inputs[i]) {
					end := min(len(inputs[i]), fed[i]+chunk)
					batch = append(batch, engine.StepInput{Seq: engine.SeqID(i), Tokens: inputs[i][fed[i]:end], Sample: end == len(inputs[i])})
					fed[i] = end
				}
			}
			outs, err := m.Step(ctx, batch)
			if err != nil {
				return nil, err
			}
			for _, o := range outs {
				vecs[o.Seq] = o.Embedding
				m.Free(o.Seq, "")
				done++
			}
		}
	}
	return vecs, nil
}

// embedBench times embedding rounds of batch inputs of n random tokens
// each (one step a round on an encoder, or while they fit one step) for
// about seconds, after one warm-up round, and prints embeddings and
// tokens a second.
func embedBench(ctx context.Context, m engine.Model, batch, n int, seconds float64) error {
	emb, ok := m.(engine.Embedder)
	if !ok || m.Info().EmbedDim == 0 {
		return errors.New("the model does not embed")
	}
	vocab := min(m.Info().VocabSize, 30000)
	inputs := make([][]int32, batch)
	for i := range inputs {
		inputs[i] = make([]int32, n)
		for j := range inputs[i] {
			inputs[i][j] = int32((i*7919 + j*104729 + 13) % vocab)
		}
	}
	pool := m.Info().Pooling
	if pool == engine.PoolNone {
		pool = engine.PoolMean
	}
	if _, err := embedAll(ctx, m, emb, inputs, pool, n); err != nil { // warm-up
		return err
	}
	rounds := 0
	start := time.Now()
	for time.Since(start).Seconds() < seconds {
		if _, err := embedAll(ctx, m, emb, inputs, pool, n); err != nil {
			return err
		}
		rounds++
	}
	el := time.Since(start).Seconds()
	info := m.Info()
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"batch": batch, "tokens_per_input": n, "rounds": rounds, "seconds": el,
		"embeddings_per_s": float64(rounds*batch) / el, "tokens_per_s": float64(rounds*batch*n) / el,
		"ms_per_batch": 1000 * el / float64(rounds), "encoder": info.Encoder, "pooling": pool.String(),
	})
}

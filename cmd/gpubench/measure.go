package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/pyproc"
)

func promptFor(i, n, vocab int) []int32 {
	toks := make([]int32, n)
	for j := range toks {
		toks[j] = int32((i*7919 + j*104729) % min(120000, vocab))
	}
	return toks
}

// decode opens b sequences, prefills them in one step and times n decode
// steps driven like the batcher drives them; it returns decode tokens/s.
func decode(ctx context.Context, m *pyproc.Model, b, n int) float64 {
	return decodeWith(ctx, m, b, n, func(int) string { return "" })
}

// decodeWith is decode with sequence i opened with adapter pick(i) (""
// for the base).
func decodeWith(ctx context.Context, m *pyproc.Model, b, n int, pick func(int) string) float64 {
	batch := make([]engine.StepInput, b)
	p := &engine.SamplingParams{}
	for i := range batch {
		toks := promptFor(i, *prompt, m.Info().VocabSize)
		r, err := m.OpenAdapter(ctx, engine.SeqID(i+1), toks, "", pick(i))
		must(err)
		batch[i] = engine.StepInput{Seq: engine.SeqID(i + 1), Tokens: toks[r:], Sample: true, Params: p}
	}
	step := func() {
		outs, err := m.Step(ctx, batch)
		must(err)
		for i := range batch {
			batch[i].Tokens = []int32{outs[i].Token}
		}
	}
	step()
	t0 := time.Now()
	for range n {
		step()
	}
	el := time.Since(t0)
	for i := range batch {
		m.Free(batch[i].Seq, "")
	}
	return float64(b*n) / el.Seconds()
}

// prefillAll loads the model with room for the longest prompt and times,
// per case, one Step that feeds every prompt whole and samples its first
// token; it returns prompt tokens/s (median of 5, after a warm-up).
func prefillAll(ctx context.Context, e *pyproc.Engine, cases []prefillCase) map[string]float64 {
	longest, widest := 0, 0
	for _, c := range cases {
		longest, widest = max(longest, c.n), max(widest, c.b)
	}
	mi, err := e.Load(ctx, engine.ModelSpec{ID: "prefill", Path: *dir, ContextLength: longest + 256, MaxBatch: widest})
	must(err)
	defer mi.Close()
	res := map[string]float64{}
	for _, c := range cases {
		var ts []float64
		for r := range 6 {
			el := promptStep(ctx, mi, c, r, func(id engine.SeqID, toks []int32) (int, error) {
				_, err := mi.Open(ctx, id, toks, "")
				return 0, err // the whole prompt is fed, as before
			})
			if r > 0 {
				ts = append(ts, float64(c.b*c.n)/el.Seconds())
			}
		}
		fmt.Printf("engine prefill %s: runs %.0f tokens/s", c.name, ts)
		slices.Sort(ts)
		res[c.name] = ts[len(ts)/2]
		fmt.Printf(", median %.0f\n", res[c.name])
	}
	return res
}

// serve measures decode tokens/s through mlxserving.Server: b concurrent
// requests of the same shape as decode's, timed from the moment every
// stream has its first token to the last token.
func serve(ctx context.Context, e *pyproc.Engine, sizes []int) map[int]float64 {
	srv, err := mlxserving.New(e, mlxserving.WithBatcherOptions(batcher.WithMaxBatch(64), batcher.WithTokenBudget(64**prompt)))
	must(err)
	defer srv.Close()
	must(srv.LoadModel(ctx, engine.ModelSpec{ID: "served", Path: *dir, ContextLength: 1024, MaxBatch: 64}))
	vocab := srv.Models()[0].VocabSize
	res := map[int]float64{}
	for _, b := range sizes {
		serveOnce(ctx, srv, b, vocab) // warm-up
		res[b] = serveOnce(ctx, srv, b, vocab)
		fmt.Printf("Server decode batch %d: %.1f tokens/s\n", b, res[b])
	}
	return res
}

func serveOnce(ctx context.Context, srv *mlxserving.Server, b, vocab int) float64 {
	stamps := make([][]time.Time, b) // when each stream got each token
	var wg sync.WaitGroup
	for i := range b {
		st, err := srv.Generate(ctx, api.Request{Model: "served", PromptTokens: promptFor(i, *prompt, vocab),
			Params: api.Params{MaxTokens: *gen, IgnoreEOS: true}})
		must(err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c, err := range st.Chunks() {
				must(err)
				if c.HasToken {
					stamps[i] = append(stamps[i], time.Now())
				}
			}
		}()
	}
	wg.Wait()
	// The window: from the moment every stream has its first token (all
	// are decoding) to the last token; count the tokens inside it.
	start, end := stamps[0][0], stamps[0][len(stamps[0])-1]
	for _, s := range stamps {
		start = later(start, s[0])
		end = later(end, s[len(s)-1])
	}
	n := 0
	for _, s := range stamps {
		for _, t := range s {
			if t.After(start) {
				n++
			}
		}
	}
	return float64(n) / end.Sub(start).Seconds()
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

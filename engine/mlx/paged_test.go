//go:build mlx

package mlx

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/scheduler"
	"github.com/mlxserving/mlxserving/testmodel"
)

// The batcher over the MLX engine's block pool: admission by blocks,
// preemption when the pool runs out, every stream as it is alone.

// unpaged hides a model's paging, so the batcher reserves each sequence's
// whole possible length (prompt + max tokens) when it opens it: the MLX
// engine as the batcher saw it before it reported its blocks.
type unpaged struct{ engine.Model }

func (u unpaged) Info() engine.Info {
	i := u.Model.Info()
	i.BlockSize, i.KVBlocks = 0, 0
	return i
}

// reuseCount counts the prompt tokens Open reused from saved prefixes.
type reuseCount struct {
	*model
	reused atomic.Int64
}

func (r *reuseCount) Open(ctx context.Context, id engine.SeqID, prompt []int32, key string) (int, error) {
	n, err := r.model.Open(ctx, id, prompt, key)
	r.reused.Add(int64(n))
	return n, err
}

// streamResult is what a stream delivered.
type streamResult struct {
	tokens []int32
	finish api.FinishReason
	err    error
}

func collectStream(s *batcher.Sequence) streamResult {
	var r streamResult
	for {
		c, err := s.Recv(context.Background())
		if errors.Is(err, batcher.ErrStreamDone) {
			return r
		}
		if err != nil {
			r.err = err
			return r
		}
		if c.HasToken {
			r.tokens = append(r.tokens, c.Token)
		}
		if c.Finish != "" {
			r.finish = c.Finish
		}
	}
}

// stopAfter ends a stream after n tokens, as a client that hangs up once
// it has what it wanted.
type stopAfter struct{ n, seen int }

func (s *stopAfter) Add(int32) (string, bool) { s.seen++; return "x", s.seen == s.n }
func (s *stopAfter) Flush() string            { return "" }

// runBatched queues seqs, then starts a batcher on m, so that its first
// admission round sees them all, and returns every stream's result and
// the batcher's stats once all have ended. On a paged model it checks
// that every block is free again.
func runBatched(t *testing.T, m engine.Model, seqs []*batcher.Sequence, opts ...batcher.Option) ([]streamResult, batcher.Stats) {
	t.Helper()
	q, err := scheduler.New[*batcher.Sequence](scheduler.WithPreemption(true))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	for _, s := range seqs {
		if s.Tier == 0 {
			s.Tier = api.Normal
		}
		if err := q.Push(&batcher.Entry{Value: s, Tier: s.Tier, Cost: len(s.Prompt) + s.MaxTokens}); err != nil {
			t.Fatal(err)
		}
	}
	b, err := batcher.New(m, q, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	out := make([]streamResult, len(seqs))
	var wg sync.WaitGroup
	for i, s := range seqs {
		wg.Go(func() { out[i] = collectStream(s) })
	}
	wg.Wait()
	if pool, ok := m.(engine.BlockPool); ok && m.Info().Paged() {
		if free := pool.FreeBlocks(); free != m.Info().KVBlocks {
			t.Errorf("%d of %d blocks free after every stream ended: blocks leaked", free, m.Info().KVBlocks)
		}
	}
	return out, b.Stats()
}

// promptFor returns n prompt tokens for seed, below the tiny vocabulary.
func promptFor(seed, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((seed*31+i*7)%300 + 1)
	}
	return p
}

// batchPeak records the largest and the mean batch of the steps observed.
type batchPeak struct{ steps, inputs, peak atomic.Int64 }

func (b *batchPeak) observe(st batcher.StepStats) {
	b.steps.Add(1)
	b.inputs.Add(int64(st.Batch))
	for {
		p := b.peak.Load()
		if int64(st.Batch) <= p || b.peak.CompareAndSwap(p, int64(st.Batch)) {
			return
		}
	}
}

func (b *batchPeak) mean() float64 { return float64(b.inputs.Load()) / float64(max(b.steps.Load(), 1)) }

// TestPagedContextDoesNotCapTheBatch: the tiny checkpoint with a real
// model's default context of 131,072 tokens, a pool of two whole contexts
// (about what the default sizing gives Llama-3.2-1B in bfloat16 under a
// 20 GB MLX memory limit), and 32 requests that may each run to the end of the
// context (max tokens fitted to it, as the server does when a request
// names none) and stop after 8 tokens. Admitted by blocks, the 32 run as
// one batch; reserving every sequence's whole length, as the batcher did
// before the engine reported its blocks, runs two at a time. The paged
// run's streams equal their prompts generated alone.
func TestPagedContextDoesNotCapTheBatch(t *testing.T) {
	const ctxLen, n, gen = 131072, 32, 8
	e := newEngine(t)
	dir := tinyDir(t, func(c *testmodel.Config) { c.ContextLength = ctxLen })
	m, err := e.Load(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir, KVCapacity: 2 * ctxLen, MaxBatch: n})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if info := m.Info(); info.ContextLength != ctxLen || !info.Paged() {
		t.Fatalf("loaded with context %d, %d blocks; want %d, paged", info.ContextLength, info.KVBlocks, ctxLen)
	}
	peaks := map[bool]int64{}
	for _, paged := range []bool{false, true} {
		var model engine.Model = unpaged{m}
		if paged {
			model = m
		}
		seqs := make([]*batcher.Sequence, n)
		for i := range seqs {
			p := promptFor(i, 24)
			seqs[i] = &batcher.Sequence{Prompt: p, MaxTokens: ctxLen - len(p), IgnoreEOS: true, Text: &stopAfter{n: gen}}
		}
		var bp batchPeak
		res, _ := runBatched(t, model, seqs, batcher.WithStepObserver(bp.observe), batcher.WithTokenBudget(n*32))
		for i, got := range res {
			if got.err != nil || got.finish != api.FinishStop || len(got.tokens) != gen {
				t.Fatalf("paged=%v: request %d: %d tokens, %v, finish %q", paged, i, len(got.tokens), got.err, got.finish)
			}
			if !paged {
				continue
			}
			if want, _ := generate(t, m, engine.SeqID(1000+i), seqs[i].Prompt, gen, len(seqs[i].Prompt), nil); !slices.Equal(got.tokens, want) {
				t.Fatalf("request %d batched: %v, alone %v", i, got.tokens, want)
			}
		}
		peaks[paged] = bp.peak.Load()
		t.Logf("context %d, pool %d tokens, %d requests: paged=%v admits %d at once (mean batch %.1f over %d steps)",
			ctxLen, 2*ctxLen, n, paged, bp.peak.Load(), bp.mean(), bp.steps.Load())
	}
	if peaks[true] != n {
		t.Errorf("paged: at most %d sequences in a step, want all %d", peaks[true], n)
	}
	if peaks[false] > 2 {
		t.Errorf("reserving whole contexts: %d sequences in a step, more than the 2 that fit", peaks[false])
	}
}

// TestPagedPoolRunsOut: six sequences admitted by their prompts' blocks
// grow past what a 128-token pool holds; the batcher preempts and
// recomputes, and every stream gets the tokens it gets alone.
func TestPagedPoolRunsOut(t *testing.T) {
	e := newEngine(t)
	m := pooled(t, e, 128)
	seqs := make([]*batcher.Sequence, 6)
	for i := range seqs {
		seqs[i] = &batcher.Sequence{Prompt: promptFor(i, 20), MaxTokens: 40, IgnoreEOS: true}
	}
	res, st := runBatched(t, m, seqs)
	ref := load(t, e, tinyDir(t, nil))
	for i, got := range res {
		if want, _ := generate(t, ref, 1, seqs[i].Prompt, 40, 20, nil); got.err != nil || !slices.Equal(got.tokens, want) {
			t.Fatalf("request %d: %v (err %v), alone %v", i, got.tokens, got.err, want)
		}
	}
	if st.BlockPreemptions == 0 {
		t.Error("six sequences growing to 60 tokens each in a pool of 128 were never preempted")
	}
	t.Logf("block preemptions: %d", st.BlockPreemptions)
}

// TestPagedRandomWorkloads runs random workloads through small pools, in
// two waves: prompt and output lengths, tiers, sequences that save their
// KV, second-wave prompts that extend first-wave ones and reuse their
// saved KV, cancellations. Whatever the preemptions and evictions, every
// stream that was not cancelled ends with the tokens its prompt gets
// alone, none fails, and the pool is whole once every stream has ended.
func TestPagedRandomWorkloads(t *testing.T) {
	e := newEngine(t)
	dir := tinyDir(t, nil)
	if reused := randomWorkloads(t, e, dir, load(t, e, dir)); reused == 0 {
		t.Error("no Open reused a saved prefix: the workloads do not exercise shared rows")
	}
}

// randomWorkloads runs TestPagedRandomWorkloads' workloads on the
// checkpoint in dir, against ref alone, and returns the prompt tokens
// Open reused.
func randomWorkloads(t *testing.T, e *Engine, dir string, ref engine.Model) int64 {
	tiers := []api.Tier{api.Critical, api.Normal, api.Background}
	var reused int64
	for seed := range uint64(3) {
		rng := rand.New(rand.NewPCG(seed, 23))
		rows := 64 + rng.IntN(96)
		m := &reuseCount{model: pooledDir(t, e, dir, rows)}
		var first []*batcher.Sequence
		opts := []batcher.Option{batcher.WithMaxBatch(1 + rng.IntN(8)), batcher.WithTokenBudget(8 + rng.IntN(64))}
		for wave := range 2 {
			seqs := make([]*batcher.Sequence, 8+rng.IntN(8))
			cancel := make([]bool, len(seqs))
			for i := range seqs {
				p := promptFor(int(seed)*1000+wave*100+i, 1+rng.IntN(rows/3))
				s := &batcher.Sequence{IgnoreEOS: true, Tier: tiers[rng.IntN(3)]}
				if wave == 1 && rng.IntN(2) == 0 {
					// Extends a first-wave prompt and asks for its saved
					// KV, admitted first (Critical), before other
					// sequences' steps evict it.
					prev := first[rng.IntN(len(first))]
					n := len(prev.Prompt)
					p = append(slices.Clone(prev.Prompt[:n/2+rng.IntN(n/2+1)]), p...)
					p = p[:min(len(p), rows/2)]
					s.PrefixKey, s.Tier = prev.SaveKey, api.Critical
				}
				if rng.IntN(2) == 0 {
					s.SaveKey = fmt.Sprintf("w%d-%d", wave, i)
				}
				s.Prompt, s.MaxTokens = p, 1+rng.IntN(min(rows-len(p), 30))
				seqs[i], cancel[i] = s, rng.IntN(8) == 0
			}
			for i, s := range seqs {
				if cancel[i] {
					go s.Cancel(context.Canceled)
				}
			}
			res, st := runBatched(t, m, seqs, opts...)
			for i, got := range res {
				if cancel[i] {
					continue
				}
				want, _ := generate(t, ref, 1, seqs[i].Prompt, seqs[i].MaxTokens, len(seqs[i].Prompt), nil)
				if got.err != nil || !slices.Equal(got.tokens, want) {
					t.Fatalf("seed %d (pool %d), wave %d: request %d: %v, err %v; alone %v", seed, rows, wave, i, got.tokens, got.err, want)
				}
			}
			t.Logf("seed %d, wave %d: pool %d, %d requests, %d block preemptions, %d saved prefixes evicted, %d prompt tokens reused",
				seed, wave, rows, len(seqs), st.BlockPreemptions, len(m.EvictedSaved()), m.reused.Load())
			first = seqs
		}
		reused += m.reused.Load()
	}
	return reused
}

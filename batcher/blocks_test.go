package batcher_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/scheduler"
)

// meanBatch records the mean number of inputs per step.
type meanBatch struct{ steps, inputs atomic.Int64 }

func (m *meanBatch) observe(st batcher.StepStats) {
	m.steps.Add(1)
	m.inputs.Add(int64(st.Batch))
}

func (m *meanBatch) mean() float64 { return float64(m.inputs.Load()) / float64(max(m.steps.Load(), 1)) }

// runQueued queues seqs, then starts a batcher on a simulated model made
// with simOpts, so that the first admission round sees them all; it
// returns every stream's result once all have ended.
func runQueued(t *testing.T, simOpts []enginetest.SimOption, seqs []*batcher.Sequence, opts ...batcher.Option) []result {
	t.Helper()
	return runWrapped(t, simOpts, nil, seqs, opts...)
}

// runWrapped is runQueued with the batcher on the simulated model as wrap
// wraps it (nil: as it is).
func runWrapped(t *testing.T, simOpts []enginetest.SimOption, wrap func(engine.Model) engine.Model, seqs []*batcher.Sequence, opts ...batcher.Option) []result {
	t.Helper()
	sim, err := enginetest.NewSim(simOpts...)
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	m, err := sim.Load(context.Background(), engine.ModelSpec{ID: "sim"})
	if err != nil {
		t.Fatal(err)
	}
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
	bm := m
	if wrap != nil {
		bm = wrap(m)
	}
	b, err := batcher.New(bm, q, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	out := make([]result, len(seqs))
	var wg sync.WaitGroup
	for i, s := range seqs {
		wg.Go(func() { out[i] = collect(s) })
	}
	wg.Wait()
	b.Close() // the last step, still pending with the rows of sequences that stopped in the step before, is read
	if pool, ok := m.(engine.BlockPool); ok && m.Info().Paged() {
		if free := pool.FreeBlocks(); free != m.Info().KVBlocks {
			t.Errorf("%d of %d blocks free after every stream ended: blocks leaked", free, m.Info().KVBlocks)
		}
	}
	lastStats, lastSim = b.Stats(), sim.Stats()
	return out
}

// lastStats and lastSim are the batcher's and the simulated engine's
// stats when runQueued's streams had ended.
var (
	lastStats batcher.Stats
	lastSim   enginetest.SimStats
)

// TestPagedContextDoesNotCapTheBatch: on a model with a 131,072-token
// context whose pool holds eight whole contexts, 48 requests that may
// each run to the end of the context (max tokens fitted to it, as the
// server does when a request names none) run as one batch when the model
// pages; reserving every sequence's whole length runs eight at a time.
func TestPagedContextDoesNotCapTheBatch(t *testing.T) {
	const ctxLen, n, gen = 131072, 48, 24
	for _, paged := range []bool{true, false} {
		opts := []enginetest.SimOption{enginetest.WithContextLength(ctxLen), enginetest.WithKVCapacity(8 * ctxLen), enginetest.WithMaxBatch(64)}
		if paged {
			opts = append(opts, enginetest.WithBlockSize(16))
		}
		var mb meanBatch
		seqs := make([]*batcher.Sequence, n)
		for i := range seqs {
			p := prompt(i, 40)
			seqs[i] = &batcher.Sequence{Prompt: p, MaxTokens: ctxLen - len(p), IgnoreEOS: true, Text: &stopAfter{n: gen}}
		}
		res := runQueued(t, opts, seqs, batcher.WithStepObserver(mb.observe), batcher.WithTokenBudget(n*64))
		for i, got := range res {
			if got.err != nil || got.finish != api.FinishStop {
				t.Fatalf("paged=%v: request %d: %v, finish %q", paged, i, got.err, got.finish)
			}
		}
		t.Logf("paged=%v: mean batch %.1f over %d steps", paged, mb.mean(), mb.steps.Load())
		if paged && mb.mean() < n-1 {
			t.Errorf("paged: mean batch %.1f, want the %d requests in one batch", mb.mean(), n)
		}
		if !paged && mb.mean() > 8 {
			t.Errorf("reserving whole contexts: mean batch %.1f, more than the 8 that fit", mb.mean())
		}
	}
}

// TestPagedPoolRunsOut: sequences admitted by their prompts' blocks grow
// past what the pool holds; the batcher preempts and recomputes, and
// every stream gets the tokens it gets alone, none fails.
func TestPagedPoolRunsOut(t *testing.T) {
	seqs := make([]*batcher.Sequence, 6)
	for i := range seqs {
		seqs[i] = &batcher.Sequence{Prompt: prompt(i, 20), MaxTokens: 60, IgnoreEOS: true}
	}
	opts := []enginetest.SimOption{enginetest.WithBlockSize(16), enginetest.WithKVCapacity(8 * 16), enginetest.WithContextLength(128)}
	res := runQueued(t, opts, seqs)
	for i, got := range res {
		if want := alone(t, seqs[i].Prompt, 60); got.err != nil || !slices.Equal(got.tokens, want) {
			t.Fatalf("request %d: %v (err %v), alone %v", i, got.tokens, got.err, want)
		}
	}
	if lastStats.BlockPreemptions == 0 {
		t.Error("six sequences growing to 5 blocks each in a pool of 8 were never preempted")
	}
	t.Logf("block preemptions: %d", lastStats.BlockPreemptions)
}

// TestPagedRandomWorkloads runs random workloads — prompt lengths, output
// lengths, tiers, prompts sharing prefixes, cancellations — through small
// pools. Whatever the preemptions, every stream that was not cancelled
// ends with the tokens its prompt gets alone, no request fails, and the
// pool is whole once every stream has ended (no block leaked).
func TestPagedRandomWorkloads(t *testing.T) {
	tiers := []api.Tier{api.Critical, api.Normal, api.Background}
	for seed := range uint64(8) {
		rng := rand.New(rand.NewPCG(seed, 19))
		bs := []int{4, 8, 16}[rng.IntN(3)]
		blocks := 8 + rng.IntN(24)
		ctxLen := blocks * bs
		seqs := make([]*batcher.Sequence, 40+rng.IntN(40))
		cancel := make([]bool, len(seqs))
		for i := range seqs {
			plen := 1 + rng.IntN(min(ctxLen/2, 90))
			p := prompt(int(seed)*1000+i, plen)
			if i > 0 && rng.IntN(3) == 0 { // shares a prefix with an earlier prompt
				prev := seqs[rng.IntN(i)].Prompt
				p = append(slices.Clone(prev[:rng.IntN(len(prev))]), p...)
				p = p[:min(len(p), ctxLen/2)]
			}
			seqs[i] = &batcher.Sequence{Prompt: p, MaxTokens: 1 + rng.IntN(min(ctxLen-len(p), 60)), IgnoreEOS: true, Tier: tiers[rng.IntN(3)]}
			cancel[i] = rng.IntN(10) == 0
		}
		for i, s := range seqs {
			if cancel[i] {
				go s.Cancel(context.Canceled)
			}
		}
		opts := []enginetest.SimOption{enginetest.WithBlockSize(bs), enginetest.WithKVCapacity(ctxLen), enginetest.WithContextLength(ctxLen)}
		res := runQueued(t, opts, seqs, batcher.WithMaxBatch(1+rng.IntN(16)), batcher.WithTokenBudget(8+rng.IntN(120)))
		for i, got := range res {
			if cancel[i] {
				continue
			}
			if want := alone(t, seqs[i].Prompt, seqs[i].MaxTokens); got.err != nil || !slices.Equal(got.tokens, want) {
				t.Fatalf("seed %d (pool %d x %d): request %d: %d tokens, err %v; alone %d tokens", seed, blocks, bs, i, len(got.tokens), got.err, len(want))
			}
		}
		t.Logf("seed %d: pool %d blocks of %d, %d requests, %d block preemptions", seed, blocks, bs, len(seqs), lastStats.BlockPreemptions)
	}
}

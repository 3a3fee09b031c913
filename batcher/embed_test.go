package batcher_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
)

// embedResult reads an embedding sequence's one chunk.
func embedResult(t *testing.T, seq *batcher.Sequence) ([]float32, *api.Usage) {
	t.Helper()
	var vec []float32
	var usage *api.Usage
	for {
		c, err := seq.Recv(context.Background())
		if errors.Is(err, batcher.ErrStreamDone) {
			return vec, usage
		}
		if err != nil {
			t.Fatalf("embedding sequence: %v", err)
		}
		if c.HasToken {
			t.Fatalf("an embedding sequence generated token %d", c.Token)
		}
		if c.Finish != api.FinishStop || c.Embedding == nil {
			t.Fatalf("chunk %+v: want the vector and FinishStop", c)
		}
		vec, usage = c.Embedding, c.Usage
	}
}

// embedAlone pools input on a model of its own, fed whole.
func embedAlone(t *testing.T, simOpts []enginetest.SimOption, input []int32, pool engine.Pooling) []float32 {
	t.Helper()
	sim, err := enginetest.NewSim(simOpts...)
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	m, err := sim.Load(context.Background(), engine.ModelSpec{ID: "ref"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := m.(engine.Embedder).OpenPooled(ctx, 1, input, pool); err != nil {
		t.Fatal(err)
	}
	out, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: input, Sample: true}})
	if err != nil {
		t.Fatal(err)
	}
	return out[0].Embedding
}

// TestEmbeddingBesideGeneration runs embedding sequences, long ones cut
// into chunks by a small token budget, in the same steps as generating
// ones: each vector equals its input pooled alone and whole, each
// generation equals its prompt generated alone.
func TestEmbeddingBesideGeneration(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []enginetest.SimOption
	}{{"slots", nil}, {"paged", []enginetest.SimOption{enginetest.WithBlockSize(16)}}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.opts, nil, batcher.WithTokenBudget(24), batcher.WithMaxBatch(8))
			var gens []*batcher.Sequence
			for i := range 3 {
				gens = append(gens, &batcher.Sequence{Prompt: prompt(i, 10+i), MaxTokens: 12})
			}
			var embeds []*batcher.Sequence
			for i, pool := range []engine.Pooling{engine.PoolMean, engine.PoolCLS, engine.PoolLast, engine.PoolMean} {
				embeds = append(embeds, &batcher.Sequence{Prompt: prompt(20+i, 5+23*i), Pool: pool})
			}
			for i := range max(len(gens), len(embeds)) {
				if i < len(gens) {
					r.submit(t, gens[i])
				}
				if i < len(embeds) {
					r.submit(t, embeds[i])
				}
			}
			for _, s := range embeds {
				vec, u := embedResult(t, s)
				want := embedAlone(t, tc.opts, s.Prompt, s.Pool)
				if !slices.Equal(vec, want) {
					t.Errorf("%v pooling of %d tokens in a batch differs from alone", s.Pool, len(s.Prompt))
				}
				if u == nil || u.PromptTokens != len(s.Prompt) || u.CompletionTokens != 0 {
					t.Errorf("usage %+v, want %d prompt tokens and no completion", u, len(s.Prompt))
				}
			}
			for _, s := range gens {
				res := collect(s)
				if res.err != nil || !slices.Equal(res.tokens, alone(t, s.Prompt, 12)) {
					t.Errorf("generation beside embeddings: %v %v, want it as alone", res.tokens, res.err)
				}
			}
			if st := r.sim.Stats(); st.OpenSequences != 0 {
				t.Errorf("%d sequences left open", st.OpenSequences)
			}
		})
	}
}

// TestEncoderInputsComeWhole: an encoder's input is never chunked, even
// one longer than the token budget (it then runs in a step of its own),
// and generating on an encoder is refused with a typed error.
func TestEncoderInputsComeWhole(t *testing.T) {
	opts := []enginetest.SimOption{enginetest.WithEncoder(), enginetest.WithEmbedding(16, engine.PoolCLS, true, false)}
	r := newRig(t, opts, nil, batcher.WithTokenBudget(16), batcher.WithMaxBatch(8))
	var seqs []*batcher.Sequence
	for i := range 5 {
		s := &batcher.Sequence{Prompt: prompt(i, 6+9*i), Pool: engine.PoolMean}
		seqs = append(seqs, s)
		r.submit(t, s)
	}
	for _, s := range seqs {
		vec, _ := embedResult(t, s)
		if !slices.Equal(vec, embedAlone(t, opts, s.Prompt, engine.PoolMean)) {
			t.Errorf("encoder input of %d tokens: the vector differs from alone", len(s.Prompt))
		}
	}
	gen := &batcher.Sequence{Prompt: prompt(9, 5), MaxTokens: 4}
	r.submit(t, gen)
	var ip *api.InvalidParamError
	if res := collect(gen); !errors.As(res.err, &ip) {
		t.Errorf("generating on an encoder: %v, want an *InvalidParamError", res.err)
	}
}

// TestEmbeddingOnModelThatDoesNotEmbed fails the sequence with a typed
// error and keeps serving.
func TestEmbeddingOnModelThatDoesNotEmbed(t *testing.T) {
	r := newRig(t, []enginetest.SimOption{enginetest.WithEmbedding(0, engine.PoolNone, false, false)}, nil)
	s := &batcher.Sequence{Prompt: prompt(1, 5), Pool: engine.PoolMean}
	r.submit(t, s)
	var ip *api.InvalidParamError
	if _, err := s.Recv(context.Background()); !errors.As(err, &ip) {
		t.Errorf("embedding on a model that does not embed: %v, want an *InvalidParamError", err)
	}
	gen := &batcher.Sequence{Prompt: prompt(2, 5), MaxTokens: 3}
	r.submit(t, gen)
	if res := collect(gen); res.err != nil || len(res.tokens) != 3 {
		t.Errorf("generation after the refusal: %v %v", res.tokens, res.err)
	}
}

// stepRecorder records, for every Step, the tokens fed to embedding
// sequences and whether a generating sequence was in it.
type stepRecorder struct {
	engine.Model
	mu     sync.Mutex
	pooled map[engine.SeqID]bool
	steps  []recordedStep
}

type recordedStep struct {
	pooledTokens int
	generating   bool
}

func (r *stepRecorder) OpenPooled(ctx context.Context, id engine.SeqID, input []int32, pool engine.Pooling) error {
	r.mu.Lock()
	r.pooled[id] = true
	r.mu.Unlock()
	return r.Model.(engine.Embedder).OpenPooled(ctx, id, input, pool)
}

func (r *stepRecorder) Step(ctx context.Context, batch []engine.StepInput) ([]engine.StepOutput, error) {
	r.mu.Lock()
	var st recordedStep
	for _, in := range batch {
		if r.pooled[in.Seq] {
			st.pooledTokens += len(in.Tokens)
		} else {
			st.generating = true
		}
	}
	r.steps = append(r.steps, st)
	r.mu.Unlock()
	return r.Model.Step(ctx, batch)
}

// TestEmbeddingsYieldToGeneration: while generating sequences run,
// embedding inputs take at most their share of each step's token budget
// and join every other step only, and a generating sequence's prompt
// goes before them.
func TestEmbeddingsYieldToGeneration(t *testing.T) {
	sim, m := simModel(t)
	rec := &stepRecorder{Model: m, pooled: map[engine.SeqID]bool{}}
	r := newRigModel(t, sim, rec, nil, batcher.WithTokenBudget(64), batcher.WithMaxBatch(32), batcher.WithEmbedShare(0.25))
	gen := &batcher.Sequence{Prompt: prompt(1, 40), MaxTokens: 30}
	r.submit(t, gen)
	var embeds []*batcher.Sequence
	for i := range 12 {
		s := &batcher.Sequence{Prompt: prompt(10+i, 50), Pool: engine.PoolMean}
		embeds = append(embeds, s)
		r.submit(t, s)
	}
	late := &batcher.Sequence{Prompt: prompt(2, 30), MaxTokens: 4}
	r.submit(t, late)
	for _, s := range embeds {
		embedResult(t, s)
	}
	if res := collect(gen); res.err != nil {
		t.Fatal(res.err)
	}
	if res := collect(late); res.err != nil || len(res.tokens) != 4 {
		t.Fatalf("the late generation: %v %v", res.tokens, res.err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	alone := 0
	for i, st := range rec.steps {
		if st.generating && st.pooledTokens > 16 {
			t.Errorf("step %d: %d embedding tokens beside generation; the share allows 16", i, st.pooledTokens)
		}
		if i > 0 && st.generating && st.pooledTokens > 0 && rec.steps[i-1].generating && rec.steps[i-1].pooledTokens > 0 {
			t.Errorf("steps %d and %d both carry embeddings beside generation; they join every other step", i-1, i)
		}
		if !st.generating && st.pooledTokens > 16 {
			alone++
		}
	}
	if alone == 0 {
		t.Errorf("no step gave embeddings more than their share once generation had finished")
	}
}

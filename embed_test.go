package mlxserving_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/mlxserving/mlxserving"
	"github.com/mlxserving/mlxserving/api"
	"github.com/mlxserving/mlxserving/batcher"
	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/merge"
	"github.com/mlxserving/mlxserving/scheduler"
)

func tokensInput(toks ...int32) api.EmbedInput { return api.EmbedInput{Tokens: toks} }

func norm(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

// rawVector pools input on a simulated model of its own, as the engine
// returns it (not normalized).
func rawVector(t *testing.T, simOpts []enginetest.SimOption, input []int32) []float32 {
	t.Helper()
	sim, err := enginetest.NewSim(append([]enginetest.SimOption{enginetest.WithContextLength(256), enginetest.WithVocabSize(1000)}, simOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	m, err := sim.Load(context.Background(), engine.ModelSpec{ID: "ref"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := m.(engine.Embedder).OpenPooled(ctx, 1, input, m.Info().Pooling); err != nil {
		t.Fatal(err)
	}
	out, err := m.Step(ctx, []engine.StepInput{{Seq: 1, Tokens: input, Sample: true}})
	if err != nil {
		t.Fatal(err)
	}
	return out[0].Embedding
}

func closeTo(a []float32, b []float32, scale float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(float64(a[i])-float64(b[i])*scale) > 1e-6 {
			return false
		}
	}
	return true
}

func TestEmbed(t *testing.T) {
	f := newFixture(t, nil)
	in := [][]int32{{5, 6, 7}, {8, 9}, {5, 6, 7}, {100, 200, 300, 400}}
	req := api.EmbedRequest{Model: "sim"}
	for _, toks := range in {
		req.Inputs = append(req.Inputs, tokensInput(toks...))
	}
	res, err := f.srv.Embed(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Model != "sim" || len(res.Vectors) != len(in) || res.PromptTokens != 12 || res.Cached != 1 {
		t.Fatalf("model %q, %d vectors, %d tokens, %d cached; want sim, 4, 12, 1", res.Model, len(res.Vectors), res.PromptTokens, res.Cached)
	}
	for i, v := range res.Vectors {
		raw := rawVector(t, nil, in[i])
		if len(v) != enginetest.DefaultEmbedDim || math.Abs(norm(v)-1) > 1e-6 || !closeTo(v, raw, 1/norm(raw)) {
			t.Errorf("input %d: %d values of norm %v; want the engine's vector normalized", i, len(v), norm(v))
		}
	}
	if st := f.sim.Stats(); st.OpenSequences != 0 {
		t.Errorf("%d sequences open after Embed", st.OpenSequences)
	}
}

func TestEmbedDimensions(t *testing.T) {
	input := []int32{3, 1, 4, 1, 5}
	t.Run("not matryoshka", func(t *testing.T) {
		f := newFixture(t, nil)
		_, err := f.srv.Embed(context.Background(), api.EmbedRequest{Model: "sim", Inputs: []api.EmbedInput{tokensInput(input...)}, Dimensions: 8})
		var ip *api.InvalidParamError
		if !errors.As(err, &ip) || ip.Param != "dimensions" {
			t.Fatalf("dimensions on a model that is not Matryoshka: %v, want an *InvalidParamError on dimensions", err)
		}
	})
	t.Run("matryoshka", func(t *testing.T) {
		opts := []enginetest.SimOption{enginetest.WithEmbedding(16, engine.PoolMean, true, true)}
		f := newFixture(t, opts)
		res, err := f.srv.Embed(context.Background(), api.EmbedRequest{Model: "sim", Inputs: []api.EmbedInput{tokensInput(input...)}, Dimensions: 8})
		if err != nil {
			t.Fatal(err)
		}
		raw := rawVector(t, opts, input)[:8]
		if v := res.Vectors[0]; len(v) != 8 || !closeTo(v, raw, 1/norm(raw)) {
			t.Errorf("8 dimensions: %v; want the first 8 of the engine's vector, normalized", v)
		}
		_, err = f.srv.Embed(context.Background(), api.EmbedRequest{Model: "sim", Inputs: []api.EmbedInput{tokensInput(input...)}, Dimensions: 17})
		var ip *api.InvalidParamError
		if !errors.As(err, &ip) {
			t.Errorf("17 of 16 dimensions: %v, want an *InvalidParamError", err)
		}
	})
}

func TestEmbedNotNormalized(t *testing.T) {
	opts := []enginetest.SimOption{enginetest.WithEmbedding(16, engine.PoolCLS, false, false)}
	f := newFixture(t, opts)
	input := []int32{9, 8, 7}
	res, err := f.srv.Embed(context.Background(), api.EmbedRequest{Model: "sim", Inputs: []api.EmbedInput{tokensInput(input...)}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Vectors[0], rawVector(t, opts, input)) {
		t.Errorf("a model that does not normalize: the vector differs from the engine's")
	}
}

func TestEmbedRefusesBadInput(t *testing.T) {
	f := newFixture(t, nil)
	long := make([]int32, 300)
	for i := range long {
		long[i] = int32(i%900 + 1)
	}
	var ip *api.InvalidParamError
	var cl *engine.ContextLengthError
	for _, tc := range []struct {
		name string
		req  api.EmbedRequest
		want any
	}{
		{"no inputs", api.EmbedRequest{Model: "sim"}, &ip},
		{"too many", api.EmbedRequest{Model: "sim", Inputs: make([]api.EmbedInput, api.MaxEmbedInputs+1)}, &ip},
		{"empty input", api.EmbedRequest{Model: "sim", Inputs: []api.EmbedInput{tokensInput(1), {}}}, &ip},
		{"outside the vocabulary", api.EmbedRequest{Model: "sim", Inputs: []api.EmbedInput{tokensInput(1, 1000)}}, &ip},
		{"negative dimensions", api.EmbedRequest{Model: "sim", Inputs: []api.EmbedInput{tokensInput(1)}, Dimensions: -1}, &ip},
		{"over the context", api.EmbedRequest{Model: "sim", Inputs: []api.EmbedInput{tokensInput(long...)}}, &cl},
	} {
		if _, err := f.srv.Embed(context.Background(), tc.req); !errors.As(err, tc.want) {
			t.Errorf("%s: %v, want %T", tc.name, err, tc.want)
		}
	}
	if _, err := f.srv.Embed(context.Background(), api.EmbedRequest{Model: "nope", Inputs: []api.EmbedInput{tokensInput(1)}}); !errors.Is(err, engine.ErrModelNotFound) {
		t.Errorf("unknown model: %v", err)
	}
	res, err := f.srv.Embed(context.Background(), api.EmbedRequest{Model: "sim", Inputs: []api.EmbedInput{tokensInput(long...)}, Truncate: true})
	if err != nil {
		t.Fatal(err)
	}
	want := rawVector(t, nil, long[:256])
	if res.PromptTokens != 256 || !closeTo(res.Vectors[0], want, 1/norm(want)) {
		t.Errorf("truncated input: %d tokens; want the first 256 embedded", res.PromptTokens)
	}
}

func TestEmbedOnModelThatDoesNotEmbed(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithEmbedding(0, engine.PoolNone, false, false)})
	_, err := f.srv.Embed(context.Background(), api.EmbedRequest{Model: "sim", Inputs: []api.EmbedInput{tokensInput(1, 2)}})
	var ip *api.InvalidParamError
	if !errors.As(err, &ip) || ip.Param != "model" {
		t.Fatalf("embedding on a model that does not: %v, want an *InvalidParamError on model", err)
	}
}

func TestEmbedCached(t *testing.T) {
	f := newFixture(t, nil, mlxserving.WithMerging(merge.WithCache(1<<20, time.Minute)))
	req := api.EmbedRequest{Model: "sim", Inputs: []api.EmbedInput{tokensInput(1, 2, 3), tokensInput(4, 5)}, Cache: true}
	first, err := f.srv.Embed(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	steps := f.sim.Stats().Steps
	second, err := f.srv.Embed(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if second.Cached != 2 || f.sim.Stats().Steps != steps {
		t.Errorf("the same inputs again: %d cached, %d more steps; want both from the cache", second.Cached, f.sim.Stats().Steps-steps)
	}
	for i := range first.Vectors {
		if !slices.Equal(first.Vectors[i], second.Vectors[i]) {
			t.Errorf("input %d: the cached vector differs", i)
		}
	}
}

func TestEmbedCancelled(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithStepTime(20*time.Millisecond, 0)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	var inputs []api.EmbedInput
	for i := range 200 {
		inputs = append(inputs, tokensInput(int32(i+1), 7, 7))
	}
	if _, err := f.srv.Embed(ctx, api.EmbedRequest{Model: "sim", Inputs: inputs}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a cancelled embedding: %v", err)
	}
	waitFor(t, "every sequence freed", func() bool { return f.sim.Stats().OpenSequences == 0 })
}

// TestEmbedRefusedByScheduler: a full queue refuses the request with the
// scheduler's typed error, and the server keeps serving.
func TestEmbedRefusedByScheduler(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithStepTime(50*time.Millisecond, 0)},
		mlxserving.WithSchedulerOptions(scheduler.WithMaxQueued(1)), mlxserving.WithBatcherOptions(batcher.WithMaxBatch(1)))
	var inputs []api.EmbedInput
	for i := range 8 {
		inputs = append(inputs, tokensInput(int32(i+1), 2, 3))
	}
	_, err := f.srv.Embed(context.Background(), api.EmbedRequest{Model: "sim", Inputs: inputs})
	if !errors.Is(err, scheduler.ErrQueueFull) {
		t.Fatalf("eight inputs on a queue of one: %v, want the queue-full error", err)
	}
	waitFor(t, "every sequence freed", func() bool { return f.sim.Stats().OpenSequences == 0 })
	if _, err := f.srv.Embed(context.Background(), api.EmbedRequest{Model: "sim", Inputs: inputs[:1]}); err != nil {
		t.Fatalf("after the refusal: %v", err)
	}
}

// TestWarmEncoder: an encoder, which cannot generate, warms up with an
// embedding through the whole stack (a server pre-warming it becomes
// ready).
func TestWarmEncoder(t *testing.T) {
	f := newFixture(t, []enginetest.SimOption{enginetest.WithEncoder(), enginetest.WithEmbedding(8, engine.PoolCLS, true, false)})
	steps := f.sim.Stats().Steps
	rep, err := f.srv.WarmModel(context.Background(), "sim", nil)
	if err != nil {
		t.Fatalf("warming an encoder: %v", err)
	}
	if rep.Generations != 1 || rep.Tokens != 3 || f.sim.Stats().Steps == steps {
		t.Errorf("report %+v after %d steps; want one 3-token embedding run", rep, f.sim.Stats().Steps-steps)
	}
}

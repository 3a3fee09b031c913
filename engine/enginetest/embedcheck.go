package enginetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// EmbedTolerance is how far RunEmbedding lets two vectors of the same
// input differ (batched against alone, chunked against whole), as the
// largest absolute difference over the vector's largest magnitude: a
// float32 engine's batched kernels reorder sums, nothing more.
const EmbedTolerance = 1e-4

// RunEmbedding runs the embedding checks against eng, loading the
// checkpoint in dir; the model must embed (engine.Info.EmbedDim > 0 and
// an engine.Embedder). Each check is a subtest -run can pick:
// embed_info, embed_determinism (every pooling twice alike, finite,
// EmbedDim long), embed_batch_invariance (several inputs in one step
// equal each alone), embed_chunked (decoders: an input fed in chunks
// equals it fed whole), embed_mixed (decoders: embedding and generating
// sequences in the same steps each get what they get alone), and
// embed_refusals (bad poolings, inputs over the context, and an encoder's
// generating or split inputs get typed errors, after which the model
// still serves). Run closes the model it loaded but not eng.
func RunEmbedding(t *testing.T, eng engine.Engine, dir string) {
	t.Helper()
	ctx := context.Background()
	m, err := eng.Load(ctx, engine.ModelSpec{ID: mainID, Path: dir})
	if err != nil {
		t.Fatalf("enginetest: Load(%q): %v", dir, err)
	}
	defer func() {
		if err := m.Close(); err != nil {
			t.Errorf("closing model %q: %v", mainID, err)
		}
	}()
	e, ok := m.(engine.Embedder)
	if !ok || m.Info().EmbedDim <= 0 {
		t.Fatalf("enginetest: model from %q does not embed (EmbedDim %d, Embedder %v)", dir, m.Info().EmbedDim, ok)
	}
	s := &embedSuite{suite: suite{ctx: ctx, m: m, info: m.Info()}, e: e}
	for _, c := range []struct {
		name  string
		check func(testing.TB, *embedSuite)
	}{
		{"embed_info", checkEmbedInfo},
		{"embed_determinism", checkEmbedDeterminism},
		{"embed_batch_invariance", checkEmbedBatch},
		{"embed_chunked", checkEmbedChunked},
		{"embed_mixed", checkEmbedMixed},
		{"embed_refusals", checkEmbedRefusals},
	} {
		t.Run(c.name, func(t *testing.T) { c.check(t, s) })
	}
}

type embedSuite struct {
	suite
	e engine.Embedder
}

// embedJob is one embedding sequence: its input, pooling and chunking.
type embedJob struct {
	input []int32
	pool  engine.Pooling
	chunk int // 0 feeds the input whole
	id    engine.SeqID
	fed   int
	vec   []float32
}

// embed runs jobs together, each input of a step taking the next chunk of
// every unfinished job, and gens generating plans beside them; it fills
// each job's vec.
func (s *embedSuite) embed(tb testing.TB, jobs []*embedJob, gens ...*plan) {
	tb.Helper()
	for _, j := range jobs {
		j.id = s.id()
		if err := s.e.OpenPooled(s.ctx, j.id, j.input, j.pool); err != nil {
			tb.Fatalf("OpenPooled(%d tokens, %v): %v", len(j.input), j.pool, err)
		}
	}
	for _, g := range gens {
		if g.params == nil {
			g.params = &engine.SamplingParams{}
		}
		g.id = s.id()
		if _, err := s.m.Open(s.ctx, g.id, g.prompt, ""); err != nil {
			tb.Fatalf("Open(%d tokens): %v", len(g.prompt), err)
		}
		g.open = true
	}
	defer func() {
		for _, j := range jobs {
			s.m.Free(j.id, "")
		}
		for _, g := range gens {
			s.m.Free(g.id, "")
		}
	}()
	for step := 0; step < maxDriverSteps; step++ {
		var batch []engine.StepInput
		var owners []*embedJob // nil for a generating input
		for _, j := range jobs {
			if j.vec != nil || len(batch) == s.info.MaxBatch {
				continue
			}
			end := len(j.input)
			if j.chunk > 0 {
				end = min(j.fed+j.chunk, end)
			}
			batch = append(batch, engine.StepInput{Seq: j.id, Tokens: j.input[j.fed:end], Sample: end == len(j.input)})
			owners = append(owners, j)
			j.fed = end
		}
		var gplans []*plan
		for _, g := range gens {
			if len(g.out) < g.n && len(batch) < s.info.MaxBatch {
				batch = append(batch, g.input())
				owners = append(owners, nil)
				gplans = append(gplans, g)
			}
		}
		if len(batch) == 0 {
			return
		}
		outs, err := s.m.Step(s.ctx, batch)
		if err != nil {
			tb.Fatalf("Step of %d inputs: %v", len(batch), err)
		}
		k, gi := 0, 0
		for i, in := range batch {
			if owners[i] == nil {
				g := gplans[gi]
				gi++
				if !in.Sample {
					continue
				}
				if k >= len(outs) || outs[k].Seq != in.Seq || outs[k].Embedding != nil {
					tb.Fatalf("step output %d does not answer generating sequence %d", k, in.Seq)
				}
				g.out = append(g.out, outs[k].Token)
				k++
				continue
			}
			if !in.Sample {
				continue
			}
			if k >= len(outs) || outs[k].Seq != in.Seq || outs[k].Token != -1 || outs[k].Embedding == nil {
				tb.Fatalf("step output %d does not carry embedding sequence %d's vector: %+v", k, in.Seq, outs)
			}
			owners[i].vec = outs[k].Embedding
			k++
		}
		if k != len(outs) {
			tb.Fatalf("%d step outputs for %d sampling inputs", len(outs), k)
		}
	}
	tb.Fatalf("embedding did not finish in %d steps", maxDriverSteps)
}

// one embeds input alone, whole.
func (s *embedSuite) one(tb testing.TB, input []int32, pool engine.Pooling) []float32 {
	tb.Helper()
	j := &embedJob{input: input, pool: pool}
	s.embed(tb, []*embedJob{j})
	return j.vec
}

// inputLen is a test input's length: long enough to chunk, within the
// context.
func (s *embedSuite) inputLen(n int) int { return max(2, min(n, s.info.ContextLength)) }

func checkEmbedInfo(tb testing.TB, s *embedSuite) {
	i := s.info
	if i.EmbedDim <= 0 || i.Pooling < engine.PoolMean || i.Pooling > engine.PoolLast {
		tb.Fatalf("Info: EmbedDim %d, Pooling %v", i.EmbedDim, i.Pooling)
	}
	if i.Encoder && i.ContextLength < 2 {
		tb.Fatalf("Info: an encoder with context %d", i.ContextLength)
	}
}

var poolings = []engine.Pooling{engine.PoolMean, engine.PoolCLS, engine.PoolLast}

func checkEmbedDeterminism(tb testing.TB, s *embedSuite) {
	in := s.prompt(11, s.inputLen(19))
	for _, p := range poolings {
		a, b := s.one(tb, in, p), s.one(tb, in, p)
		if len(a) != s.info.EmbedDim {
			tb.Fatalf("%v: %d values, EmbedDim is %d", p, len(a), s.info.EmbedDim)
		}
		for _, v := range a {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				tb.Fatalf("%v: a value is %v", p, v)
			}
		}
		sameVector(tb, fmt.Sprintf("%v twice", p), a, b)
	}
	mean, cls := s.one(tb, in, engine.PoolMean), s.one(tb, in, engine.PoolCLS)
	if diff(mean, cls) == 0 {
		tb.Errorf("mean and cls pooling give the same vector for a %d-token input", len(in))
	}
}

func checkEmbedBatch(tb testing.TB, s *embedSuite) {
	var jobs []*embedJob
	for i := range min(4, s.info.MaxBatch) {
		jobs = append(jobs, &embedJob{input: s.prompt(20+i, s.inputLen(5+7*i)), pool: poolings[i%3]})
	}
	s.embed(tb, jobs)
	for _, j := range jobs {
		sameVector(tb, fmt.Sprintf("batched %v of %d tokens", j.pool, len(j.input)), j.vec, s.one(tb, j.input, j.pool))
	}
}

func checkEmbedChunked(tb testing.TB, s *embedSuite) {
	if s.info.Encoder {
		tb.Skip("an encoder's input comes whole")
	}
	in := s.prompt(31, s.inputLen(23))
	for _, p := range poolings {
		j := &embedJob{input: in, pool: p, chunk: 5}
		s.embed(tb, []*embedJob{j})
		sameVector(tb, fmt.Sprintf("%v in chunks of 5", p), j.vec, s.one(tb, in, p))
	}
}

func checkEmbedMixed(tb testing.TB, s *embedSuite) {
	if s.info.Encoder {
		tb.Skip("an encoder does not generate")
	}
	gens := []*plan{{prompt: s.prompt(41, 9), n: 6}, {prompt: s.prompt(42, 4), n: 8}}
	jobs := []*embedJob{{input: s.prompt(43, s.inputLen(17)), pool: engine.PoolMean, chunk: 6},
		{input: s.prompt(44, s.inputLen(6)), pool: engine.PoolLast}}
	s.embed(tb, jobs, gens...)
	for _, j := range jobs {
		sameVector(tb, fmt.Sprintf("%v beside generating sequences", j.pool), j.vec, s.one(tb, j.input, j.pool))
	}
	s.sameAsAlone(tb, "beside embedding sequences", gens...)
}

func checkEmbedRefusals(tb testing.TB, s *embedSuite) {
	var ip *engine.InvalidParamError
	if err := s.e.OpenPooled(s.ctx, s.id(), s.prompt(1, 3), engine.PoolNone); !errors.As(err, &ip) {
		tb.Errorf("OpenPooled with PoolNone: %v, want an *InvalidParamError", err)
	}
	var cl *engine.ContextLengthError
	if err := s.e.OpenPooled(s.ctx, s.id(), s.prompt(2, s.info.ContextLength+1), engine.PoolMean); !errors.As(err, &cl) {
		tb.Errorf("OpenPooled over the context: %v, want a *ContextLengthError", err)
	}
	if s.info.Encoder {
		if _, err := s.m.Open(s.ctx, s.id(), s.prompt(3, 3), ""); !errors.As(err, &ip) {
			tb.Errorf("Open on an encoder: %v, want an *InvalidParamError", err)
		}
		id := s.id()
		in := s.prompt(4, s.inputLen(8))
		if err := s.e.OpenPooled(s.ctx, id, in, engine.PoolMean); err != nil {
			tb.Fatal(err)
		}
		_, err := s.m.Step(s.ctx, []engine.StepInput{{Seq: id, Tokens: in[:len(in)/2]}})
		if !errors.As(err, &ip) {
			tb.Errorf("an encoder input split over steps: %v, want an *InvalidParamError", err)
		}
		s.m.Free(id, "")
	}
	in := s.prompt(5, s.inputLen(7))
	sameVector(tb, "after the refusals", s.one(tb, in, engine.PoolLast), s.one(tb, in, engine.PoolLast))
}

// diff is the largest absolute difference of a and b over the largest
// magnitude in b.
func diff(a, b []float32) float64 {
	var d, scale float64
	for i := range b {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
		scale = max(scale, math.Abs(float64(b[i])))
	}
	if scale == 0 {
		return d
	}
	return d / scale
}

func sameVector(tb testing.TB, what string, got, want []float32) {
	tb.Helper()
	if len(got) != len(want) {
		tb.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	if d := diff(got, want); d > EmbedTolerance {
		tb.Errorf("%s: vectors differ by %.3g of their scale (tolerance %g)", what, d, EmbedTolerance)
	}
}

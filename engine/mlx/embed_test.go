//go:build mlx

package mlx

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/reference"
	"github.com/mlxserving/mlxserving/testmodel"
)

var pools = []engine.Pooling{engine.PoolMean, engine.PoolCLS, engine.PoolLast}

// embedOne embeds input alone, fed in chunks of chunk tokens.
func embedOne(t testing.TB, m engine.Model, id engine.SeqID, input []int32, pool engine.Pooling, chunk int) []float32 {
	t.Helper()
	ctx := context.Background()
	if err := m.(engine.Embedder).OpenPooled(ctx, id, input, pool); err != nil {
		t.Fatal(err)
	}
	defer m.Free(id, "")
	for i := 0; i < len(input); i += chunk {
		end := min(i+chunk, len(input))
		out, err := m.Step(ctx, []engine.StepInput{{Seq: id, Tokens: input[i:end], Sample: end == len(input)}})
		if err != nil {
			t.Fatal(err)
		}
		if end < len(input) {
			if len(out) != 0 {
				t.Fatalf("a chunk that does not end the input returned %v", out)
			}
			continue
		}
		if len(out) != 1 || out[0].Seq != id || out[0].Token != -1 || len(out[0].Embedding) != m.Info().EmbedDim {
			t.Fatalf("the last chunk returned %+v, want one output for seq %d with token -1 and %d values", out, id, m.Info().EmbedDim)
		}
		return out[0].Embedding
	}
	return nil
}

// embedMixed embeds inputs together, input i in chunks of i+2 tokens
// (whole on an encoder), in the same steps as greedy generating
// sequences for gens (n tokens each; a prompt in one step, then decode
// steps). It returns the vectors and the generated tokens.
func embedMixed(t testing.TB, m engine.Model, inputs [][]int32, pool engine.Pooling, gens [][]int32, n int) ([][]float32, [][]int32) {
	t.Helper()
	ctx := context.Background()
	vecs, toks := make([][]float32, len(inputs)), make([][]int32, len(gens))
	fed := make([]int, len(inputs))
	for i, in := range inputs {
		if err := m.(engine.Embedder).OpenPooled(ctx, engine.SeqID(200+i), in, pool); err != nil {
			t.Fatal(err)
		}
		defer m.Free(engine.SeqID(200+i), "")
	}
	for i, p := range gens {
		if _, err := m.Open(ctx, engine.SeqID(300+i), p, ""); err != nil {
			t.Fatal(err)
		}
		defer m.Free(engine.SeqID(300+i), "")
	}
	for {
		var batch []engine.StepInput
		for i, in := range inputs {
			if fed[i] == len(in) {
				continue
			}
			end := len(in)
			if !m.Info().Encoder {
				end = min(fed[i]+i+2, len(in))
			}
			batch = append(batch, engine.StepInput{Seq: engine.SeqID(200 + i), Tokens: in[fed[i]:end], Sample: end == len(in)})
			fed[i] = end
		}
		for i, p := range gens {
			switch {
			case len(toks[i]) == 0:
				batch = append(batch, engine.StepInput{Seq: engine.SeqID(300 + i), Tokens: p, Sample: true})
			case len(toks[i]) < n:
				batch = append(batch, engine.StepInput{Seq: engine.SeqID(300 + i), Tokens: toks[i][len(toks[i])-1:], Sample: true})
			}
		}
		if len(batch) == 0 {
			return vecs, toks
		}
		out, err := m.Step(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range out {
			switch id := int(o.Seq); {
			case id >= 300:
				if o.Embedding != nil {
					t.Fatalf("generating seq %d got an embedding", id)
				}
				toks[id-300] = append(toks[id-300], o.Token)
			default:
				if o.Token != -1 || vecs[id-200] != nil {
					t.Fatalf("embedding seq %d: token %d, vector already returned %v", id, o.Token, vecs[id-200] != nil)
				}
				vecs[id-200] = o.Embedding
			}
		}
	}
}

// maxAbs is the largest |a[i] - b[i]|.
func maxAbs[T float32 | float64](a []float32, b []T) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var d float64
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

// embedInputs are the test inputs: lengths 5, 37 and 1, and a second
// input of 37 so that an encoder step groups two of a length.
func embedInputs() [][]int32 {
	return [][]int32{refPrompt(1, 5), refPrompt(2, 37), refPrompt(3, 1), refPrompt(4, 37)}
}

// TestEmbedMatchesReference compares pooled vectors (mean, cls,
// lasttoken) with internal/reference's float64 last hidden state, within
// 1e-4: both encoders (bare, masked-LM and transformers-5 checkpoints;
// BERT also with hidden size 256), and qwen3, llama and gemma3 decoders (qwen3 also as the bare
// Qwen3Model an embedding checkpoint publishes). A decoder's input runs
// whole, in chunks of 7, and in chunks of 1 (llama's then run the fused
// decode-only layers), and the chunked vectors equal the whole one's
// within 2e-5; every model also embeds all inputs in one batch, beside
// generating sequences on a decoder, equal to alone within 2e-5 and
// with the generated tokens unchanged.
func TestEmbedMatchesReference(t *testing.T) {
	py := python(t)
	e := newEngine(t)
	cases := map[string]testmodel.Config{}
	for _, arch := range []string{"bert", "modernbert", "qwen3", "llama", "gemma3_text"} {
		cases[arch] = testmodel.TinyFamily(arch)
	}
	c := testmodel.TinyFamily("bert")
	c.MaskedLM = true
	cases["bert-masked-lm"] = c
	c = testmodel.TinyFamily("modernbert")
	c.TransformersV5, c.MaskedLM = true, true
	cases["modernbert-v5-masked-lm"] = c
	c = testmodel.TinyFamily("qwen3")
	c.BaseModel = true
	cases["qwen3-bare"] = c
	// LayerNorm rows of 256 float32 values: the band where MLX 0.31's
	// CUDA rms_norm mixes rows (rmsNormMixesRows); its layer_norm is
	// checked on the same shape.
	c = testmodel.TinyFamily("bert")
	c.Hidden, c.Intermediate = 256, 512
	cases["bert-hidden256"] = c
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) { matchEmbeddings(t, py, e, cfg) })
	}
}

func matchEmbeddings(t *testing.T, py string, e *Engine, cfg testmodel.Config) {
	dir := t.TempDir()
	if err := testmodel.Write(dir, cfg); err != nil {
		t.Fatal(err)
	}
	m, err := e.Load(context.Background(), engine.ModelSpec{ID: "tiny", Path: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	info := m.Info()
	if info.EmbedDim != cfg.Hidden || info.Encoder != testmodel.IsEncoder(cfg.Arch) {
		t.Fatalf("Info: EmbedDim %d, Encoder %v; want %d, %v", info.EmbedDim, info.Encoder, cfg.Hidden, testmodel.IsEncoder(cfg.Arch))
	}
	inputs := embedInputs()
	gens := [][]int32{}
	var alone [][]int32
	if !info.Encoder && !(cfg.BaseModel && !cfg.TieEmbeddings) {
		gens = [][]int32{refPrompt(5, 6), refPrompt(6, 3)}
		for i, p := range gens {
			toks, _ := generate(t, m, engine.SeqID(400+i), p, 5, len(p), nil)
			alone = append(alone, toks)
		}
	}
	var worst, worstChunk, worstBatch float64
	for _, pool := range pools {
		ref, err := reference.Embed(context.Background(), py, dir, inputs, pool)
		if err != nil {
			t.Fatal(err)
		}
		whole := make([][]float32, len(inputs))
		for i, in := range inputs {
			whole[i] = embedOne(t, m, engine.SeqID(i), in, pool, len(in))
			d := maxAbs(whole[i], ref[i])
			worst = math.Max(worst, d)
			if d > 1e-4 {
				t.Errorf("%v input %d (%d tokens): max |difference| from the reference %.3g", pool, i, len(in), d)
			}
			if info.Encoder {
				continue
			}
			chunks := []int{7}
			if cfg.Arch == "llama" {
				chunks = append(chunks, 1)
			}
			for _, n := range chunks {
				got := embedOne(t, m, engine.SeqID(i), in, pool, n)
				d := maxAbs(got, whole[i])
				worstChunk = math.Max(worstChunk, d)
				if d > 2e-5 {
					t.Errorf("%v input %d in chunks of %d: max |difference| from whole %.3g", pool, i, n, d)
				}
			}
		}
		vecs, toks := embedMixed(t, m, inputs, pool, gens, 5)
		for i := range inputs {
			d := maxAbs(vecs[i], whole[i])
			worstBatch = math.Max(worstBatch, d)
			if d > 2e-5 {
				t.Errorf("%v input %d batched: max |difference| from alone %.3g", pool, i, d)
			}
		}
		for i := range gens {
			if !slices.Equal(toks[i], alone[i]) {
				t.Errorf("%v: generating seq %d beside embeddings %v, alone %v", pool, i, toks[i], alone[i])
			}
		}
	}
	t.Logf("max |difference|: from the reference %.2e, chunked from whole %.2e, batched from alone %.2e", worst, worstChunk, worstBatch)
}

// TestEmbedErrors checks the typed errors of the embedding contract.
func TestEmbedErrors(t *testing.T) {
	e := newEngine(t)
	ctx := context.Background()
	enc := load2(t, e, testmodel.TinyFamily("modernbert"))
	dec := load2(t, e, testmodel.TinyFamily("qwen3"))
	bare := testmodel.TinyFamily("llama")
	bare.BaseModel = true
	headless := load2(t, e, bare)
	in := refPrompt(1, 9)
	invalid := func(what string, err error) {
		t.Helper()
		if _, ok := err.(*engine.InvalidParamError); !ok {
			t.Errorf("%s: %v (%T), want *engine.InvalidParamError", what, err, err)
		}
	}
	_, err := enc.Open(ctx, 1, in, "")
	invalid("Open on an encoder", err)
	small := testmodel.TinyFamily("bert")
	dir := t.TempDir()
	if err := testmodel.Write(dir, small); err != nil {
		t.Fatal(err)
	}
	capped, err := e.Load(ctx, engine.ModelSpec{ID: "capped", Path: dir, KVCapacity: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer capped.Close()
	var over []engine.StepInput
	for i := range 3 {
		long := refPrompt(i, 200)
		if err := capped.(engine.Embedder).OpenPooled(ctx, engine.SeqID(10+i), long, engine.PoolCLS); err != nil {
			t.Fatal(err)
		}
		defer capped.Free(engine.SeqID(10+i), "")
		over = append(over, engine.StepInput{Seq: engine.SeqID(10 + i), Tokens: long, Sample: true})
	}
	if _, err := capped.Step(ctx, over); !errors.Is(err, engine.ErrOutOfMemory) {
		t.Errorf("a step past an encoder's KVCapacity: %v, want engine.ErrOutOfMemory", err)
	}
	if out, err := capped.Step(ctx, over[:2]); err != nil || len(out) != 2 {
		t.Errorf("a step within KVCapacity: %v, %v", out, err)
	}
	_, err = headless.Open(ctx, 1, in, "")
	invalid("Open on a bare model without a head", err)
	for _, m := range []engine.Model{enc, dec} {
		em := m.(engine.Embedder)
		invalid("PoolNone", em.OpenPooled(ctx, 1, in, engine.PoolNone))
		invalid("empty input", em.OpenPooled(ctx, 1, nil, engine.PoolMean))
		invalid("token past the vocabulary", em.OpenPooled(ctx, 1, []int32{1, 5000}, engine.PoolMean))
		long := make([]int32, m.Info().ContextLength+1)
		if err := em.OpenPooled(ctx, 1, long, engine.PoolMean); !isContextLength(err) {
			t.Errorf("input past the context: %v, want *engine.ContextLengthError", err)
		}
		if err := em.OpenPooled(ctx, 2, in, engine.PoolMean); err != nil {
			t.Fatal(err)
		}
		invalid("duplicate id", em.OpenPooled(ctx, 2, in, engine.PoolMean))
		_, err = m.Step(ctx, []engine.StepInput{{Seq: 2, Tokens: in[:4], Sample: true}})
		invalid("Sample before the input ends", err)
		_, err = m.Step(ctx, []engine.StepInput{{Seq: 2, Tokens: slices.Concat(in, in), Sample: true}})
		invalid("more tokens than the input", err)
		other := slices.Clone(in)
		other[3]++
		_, err = m.Step(ctx, []engine.StepInput{{Seq: 2, Tokens: other, Sample: true}})
		invalid("tokens that differ from the input", err)
		if m.Info().Encoder {
			_, err = m.Step(ctx, []engine.StepInput{{Seq: 2, Tokens: in[:4]}})
			invalid("an encoder input split across steps", err)
		}
		out, err := m.Step(ctx, []engine.StepInput{{Seq: 2, Tokens: in, Sample: true}})
		if err != nil || len(out) != 1 || out[0].Token != -1 {
			t.Fatalf("whole input: %+v, %v", out, err)
		}
		_, err = m.Step(ctx, []engine.StepInput{{Seq: 2, Tokens: in[:1], Sample: true}})
		invalid("a step after the vector was returned", err)
		m.Free(2, "keep")
		if sk, ok := m.(engine.SavedKV); ok {
			if n, _ := m.Open(ctx, 3, in, "keep"); n != 0 {
				t.Errorf("an embedding sequence was saved: Open reused %d tokens", n)
			}
			m.Free(3, "")
			if ev := sk.EvictedSaved(); len(ev) != 0 {
				t.Errorf("EvictedSaved %v after freeing an embedding sequence with a key", ev)
			}
		}
	}
}

func isContextLength(err error) bool { _, ok := err.(*engine.ContextLengthError); return ok }

// load2 writes cfg's checkpoint and loads it.
func load2(t testing.TB, e *Engine, cfg testmodel.Config) engine.Model {
	t.Helper()
	dir := t.TempDir()
	if err := testmodel.Write(dir, cfg); err != nil {
		t.Fatal(err)
	}
	m, err := e.Load(context.Background(), engine.ModelSpec{ID: cfg.Arch, Path: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestEmbedInfo checks what Info says about a checkpoint's embeddings:
// sentence-transformers' pooling, normalization, max_seq_length (an
// encoder's context) and Matryoshka dimensions, the families' defaults
// without them, and a pooling the engine cannot reproduce refused.
func TestEmbedInfo(t *testing.T) {
	e := newEngine(t)
	bge := testmodel.TinyFamily("bert")
	bge.Embedding = &testmodel.Embedding{Pooling: "cls", Normalize: true, MaxSeqLength: 100, MatryoshkaDims: []int{32, 64}}
	info := load2(t, e, bge).Info()
	if info.Pooling != engine.PoolCLS || !info.Normalize || info.ContextLength != 100 || !info.Matryoshka ||
		!slices.Equal(info.MatryoshkaDims, []int{32, 64}) || !info.Encoder || info.EmbedDim != 64 || info.Paged() {
		t.Errorf("bge-like Info %+v", info)
	}
	qe := testmodel.TinyFamily("qwen3")
	qe.Embedding = &testmodel.Embedding{Pooling: "lasttoken", Normalize: false}
	if info := load2(t, e, qe).Info(); info.Pooling != engine.PoolLast || info.Normalize || info.Encoder || info.ContextLength != 512 {
		t.Errorf("qwen3 embedding Info %+v", info)
	}
	if info := load2(t, e, testmodel.TinyFamily("llama")).Info(); info.Pooling != engine.PoolLast || !info.Normalize || info.EmbedDim != 64 {
		t.Errorf("default decoder Info: pooling %v, normalize %v, dim %d", info.Pooling, info.Normalize, info.EmbedDim)
	}
	if info := load2(t, e, testmodel.TinyFamily("modernbert")).Info(); info.Pooling != engine.PoolMean || !info.Normalize {
		t.Errorf("default encoder Info: pooling %v, normalize %v", info.Pooling, info.Normalize)
	}
	maxPool := testmodel.TinyFamily("bert")
	maxPool.Embedding = &testmodel.Embedding{Pooling: "max"}
	dir := t.TempDir()
	if err := testmodel.Write(dir, maxPool); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Load(context.Background(), engine.ModelSpec{ID: "max", Path: dir}); !isCheckpoint(err) {
		t.Errorf("max pooling: %v, want *engine.CheckpointError", err)
	}
}

func isCheckpoint(err error) bool { _, ok := err.(*engine.CheckpointError); return ok }

// TestEmbedEveryFamily embeds on every decoder family testmodel writes
// (TinyFamily: sliding windows of 16, experts, longrope, Gemma's norms
// and caps), mean-pooled so that every token's hidden state counts, in
// chunks of 9 (past the windows), against the reference within 1e-4.
func TestEmbedEveryFamily(t *testing.T) {
	py := python(t)
	e := newEngine(t)
	inputs := [][]int32{refPrompt(7, 37), refPrompt(8, 3)}
	for _, arch := range testmodel.Archs() {
		t.Run(arch, func(t *testing.T) {
			dir := t.TempDir()
			if err := testmodel.Write(dir, testmodel.TinyFamily(arch)); err != nil {
				t.Fatal(err)
			}
			ref, err := reference.Embed(context.Background(), py, dir, inputs, engine.PoolMean)
			if err != nil {
				t.Fatal(err)
			}
			m, err := e.Load(context.Background(), engine.ModelSpec{ID: arch, Path: dir})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			var worst float64
			for i, in := range inputs {
				d := maxAbs(embedOne(t, m, engine.SeqID(i), in, engine.PoolMean, 9), ref[i])
				worst = math.Max(worst, d)
				if d > 1e-4 {
					t.Errorf("input %d (%d tokens): max |difference| from the reference %.3g", i, len(in), d)
				}
			}
			t.Logf("max |difference| from the reference %.2e", worst)
		})
	}
}

// TestEmbedBFloat16 embeds on bfloat16 checkpoints (as Qwen3-Embedding
// publishes them; a BERT and a ModernBERT likewise): the hidden states
// are pooled in float32 from bfloat16 rows, within bfloat16's precision
// (3% of the largest value) of the float64 reference.
func TestEmbedBFloat16(t *testing.T) {
	py := python(t)
	e := newEngine(t)
	inputs := [][]int32{refPrompt(9, 30)}
	for _, arch := range []string{"qwen3", "bert", "modernbert"} {
		t.Run(arch, func(t *testing.T) {
			cfg := testmodel.TinyFamily(arch)
			cfg.DType = "bfloat16"
			dir := t.TempDir()
			if err := testmodel.Write(dir, cfg); err != nil {
				t.Fatal(err)
			}
			m, err := e.Load(context.Background(), engine.ModelSpec{ID: arch, Path: dir})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			for _, pool := range pools {
				ref, err := reference.Embed(context.Background(), py, dir, inputs, pool)
				if err != nil {
					t.Fatal(err)
				}
				got := embedOne(t, m, 1, inputs[0], pool, len(inputs[0]))
				var scale float64
				for _, v := range ref[0] {
					scale = math.Max(scale, math.Abs(v))
				}
				d := maxAbs(got, ref[0])
				if d > 0.03*scale {
					t.Errorf("%v: max |difference| %.3g, largest value %.3g", pool, d, scale)
				}
				t.Logf("%v: max |difference| %.2e of largest value %.2e", pool, d, scale)
			}
		})
	}
}

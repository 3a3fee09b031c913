package pyproc

import (
	"context"
	"math"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/reference"
	"github.com/mlxserving/mlxserving/testmodel"
)

var poolings = []engine.Pooling{engine.PoolMean, engine.PoolCLS, engine.PoolLast}

// embedCases are the checkpoints the embedding tests load: both encoders
// (bert also as BertForMaskedLM writes it, under bert.), and decoders of
// three families (qwen3 also as Qwen3-Embedding publishes it: the bare
// Qwen3Model's weights, sentence-transformers files for last-token
// pooling).
func embedCases() map[string]testmodel.Config {
	cases := map[string]testmodel.Config{}
	for _, arch := range []string{"bert", "modernbert", "qwen3", "llama", "gemma3"} {
		cases[arch] = testmodel.TinyFamily(arch)
	}
	masked := testmodel.TinyFamily("bert")
	masked.MaskedLM = true
	cases["bert-maskedlm"] = masked
	st := testmodel.TinyFamily("qwen3")
	st.BaseModel = true
	st.Embedding = &testmodel.Embedding{Pooling: "lasttoken", Normalize: true, MaxSeqLength: 256}
	cases["qwen3-embedding"] = st
	return cases
}

// TestEmbedMatchesReference checks pooled vectors against
// internal/reference's float64 forward within 1e-4, every pooling, for
// inputs of 5, 40 and 1 tokens: fed whole in one step beside a
// generating sequence, and (decoders) in chunks of 7 beside it; the
// generating sequence's tokens equal those it decodes alone.
func TestEmbedMatchesReference(t *testing.T) {
	py := python(t)
	e := newEngine(t)
	ctx := context.Background()
	inputs := [][]int32{prompt(1, 5), prompt(2, 40), prompt(3, 1)}
	for name, cfg := range embedCases() {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := testmodel.Write(dir, cfg); err != nil {
				t.Fatal(err)
			}
			m := load(t, e, dir)
			defer m.Close()
			enc := testmodel.IsEncoder(cfg.Arch)
			info := m.Info()
			want := engine.PoolLast
			if enc {
				want = engine.PoolMean
			}
			if info.EmbedDim != cfg.Hidden || info.Encoder != enc || info.Pooling != want || !info.Normalize {
				t.Fatalf("info: embed_dim %d encoder %v pooling %v normalize %v", info.EmbedDim, info.Encoder, info.Pooling, info.Normalize)
			}
			var alone []int32
			if !enc {
				alone = generate(t, m, 900, prompt(9, 6), 4)
			}
			for _, pool := range poolings {
				ref, err := reference.Embed(ctx, py, dir, inputs, pool)
				if err != nil {
					t.Fatal(err)
				}
				chunks := []int{0}
				if !enc {
					chunks = append(chunks, 7)
				}
				for _, chunk := range chunks {
					got, toks := embedBeside(t, m, inputs, pool, chunk, !enc)
					for i := range inputs {
						if d := maxAbs(got[i], ref[i]); d > 1e-4 {
							t.Errorf("%v, input %d (%d tokens), chunks of %d: differs from the reference by %g", pool, i, len(inputs[i]), chunk, d)
						}
					}
					if !enc && !equalTokens(toks, alone) {
						t.Errorf("%v, chunks of %d: the generating sequence decoded %v beside the pooled ones, %v alone", pool, chunk, toks, alone)
					}
				}
			}
		})
	}
}

// embedBeside embeds inputs (chunk 0: each whole, in one step; else in
// chunks of that many tokens, a step per chunk) and, with gen, a sequence
// decoding greedily in the same steps; it returns the vectors and the
// decoded tokens.
func embedBeside(t *testing.T, m *Model, inputs [][]int32, pool engine.Pooling, chunk int, gen bool) ([][]float32, []int32) {
	t.Helper()
	ctx := context.Background()
	const genSeq = 800
	var feed, toks []int32
	if gen {
		feed = openFeed(t, m, genSeq, prompt(9, 6))
		defer m.Free(genSeq, "")
	}
	for i, in := range inputs {
		if err := m.OpenPooled(ctx, engine.SeqID(i+1), in, pool); err != nil {
			t.Fatal(err)
		}
		defer m.Free(engine.SeqID(i+1), "ignored")
	}
	got := make([][]float32, len(inputs))
	at := make([]int, len(inputs))
	for done := 0; done < len(inputs) || (gen && len(toks) < 4); {
		var batch []engine.StepInput
		if gen && len(toks) < 4 {
			batch = append(batch, engine.StepInput{Seq: genSeq, Tokens: feed, Sample: true, Params: greedy})
		}
		for i, in := range inputs {
			if got[i] != nil {
				continue
			}
			n := len(in) - at[i]
			if chunk > 0 {
				n = min(n, chunk)
			}
			batch = append(batch, engine.StepInput{Seq: engine.SeqID(i + 1), Tokens: in[at[i] : at[i]+n], Sample: at[i]+n == len(in)})
			at[i] += n
		}
		outs, err := m.Step(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range outs {
			if o.Seq == genSeq {
				if o.Embedding != nil {
					t.Fatalf("the generating sequence got an embedding")
				}
				toks = append(toks, o.Token)
				feed = []int32{o.Token}
				continue
			}
			if o.Token != -1 || len(o.Embedding) != m.Info().EmbedDim {
				t.Fatalf("pooled output %d: token %d, %d values", o.Seq, o.Token, len(o.Embedding))
			}
			got[o.Seq-1] = o.Embedding
			done++
		}
	}
	return got, toks
}

func maxAbs(a []float32, b []float64) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-b[i]))
	}
	return d
}

func equalTokens(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

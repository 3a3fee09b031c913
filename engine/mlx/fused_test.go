//go:build mlx

package mlx

import (
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// decodeLogits opens b sequences of mixed prompt lengths, prefills them
// in one step, then feeds steps fixed tokens to all of them at once (a
// decode-only step each) and returns each step's logits per sequence,
// with every sequence's tokens after the last step.
func decodeLogits(t testing.TB, m *model, b, steps int) (logits [][][]float32, seqs [][]int32) {
	t.Helper()
	err := m.call(func(g *graph) error {
		feeds := make([]feed, b)
		for i := range feeds {
			p := prompts()[i%len(prompts())]
			p = p[:max(1, len(p)-i%3)] // lengths differ
			feeds[i] = feed{seq: &seqState{}, tokens: p, sample: true}
		}
		defer func() {
			for _, f := range feeds {
				f.seq.free()
			}
		}()
		for s := 0; s <= steps; s++ {
			lg := m.forward(g, feeds, true)
			g.eval(append([]arr{lg}, m.pool.kv...)...)
			if g.err != nil {
				return g.err
			}
			all, err := readFloat32s(lg)
			if err != nil {
				return err
			}
			if s > 0 {
				v := len(all) / b
				step := make([][]float32, b)
				for i := range step {
					step[i] = all[i*v : (i+1)*v]
				}
				logits = append(logits, step)
			}
			for i := range feeds {
				f := &feeds[i]
				f.seq.tokens = append(f.seq.tokens, f.tokens...)
				f.tokens = []int32{int32((31*s + 11*i + 5) % m.info.VocabSize)}
			}
		}
		for _, f := range feeds {
			seqs = append(seqs, f.seq.tokens)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return logits, seqs
}

// TestDecodeMatchesPrefill checks the decode-only layers (decodeLayers:
// the CUDA kernels on a CUDA GPU, their MLX ops elsewhere) against the
// prefill path: the logits after each batched decode step equal those of
// the whole sequence prefilled alone.
func TestDecodeMatchesPrefill(t *testing.T) {
	m := load(t, newEngine(t), tinyDir(t, nil))
	for _, b := range []int{1, 3, 5} {
		logits, seqs := decodeLogits(t, m, b, 4)
		for s, step := range logits {
			for i, got := range step {
				want := lastLogits(t, m, seqs[i][:len(seqs[i])-len(logits)+s+1])
				if d, scale := maxDiff(got, want); d > 1e-4*scale {
					t.Errorf("batch %d, step %d, sequence %d: decode logits differ from prefill by %.3g (scale %.3g)", b, s, i, d, scale)
				}
			}
		}
	}
	generate(t, m, 1, prompts()[0], 3, 100, &engine.SamplingParams{}) // ends with a decode step
	if pc := m.Primitives(); pc.Of != 2 || pc.Layers < 2*10 || pc.Step <= pc.Layers {
		t.Errorf("primitive count %+v: want 2 layers of at least 10 and a step larger than its layers", pc)
	}
}

// TestFusedMatchesComposed runs only on a CUDA GPU: the fused decode
// kernels (addNorm, ropeKV, gluRows, the q-rotating pool attention)
// against the same model with WithFusedKernels(false) (MLX ops and the
// plain pool kernel), at several batch sizes with mixed lengths.
func TestFusedMatchesComposed(t *testing.T) {
	for _, dt := range []struct {
		name string
		tol  float64 // of the logits' scale
	}{{"float32", 1e-4}, {"bfloat16", 3e-2}} {
		t.Run(dt.name, func(t *testing.T) {
			dir := tinyDir(t, func(c *testmodel.Config) { c.DType = dt.name })
			base := gpuModel(t, dir, WithFusedKernels(false))
			fused := gpuModel(t, dir)
			if on := fusedOn(t, fused); !on || fusedOn(t, base) {
				t.Skipf("the fused decode kernels run only on a CUDA GPU (fused %v)", on)
			}
			for _, b := range []int{1, 2, 5, 8} {
				want, _ := decodeLogits(t, base, b, 6)
				wantPC := base.Primitives()
				got, _ := decodeLogits(t, fused, b, 6)
				gotPC := fused.Primitives()
				for s := range want {
					for i := range want[s] {
						if d, scale := maxDiff(got[s][i], want[s][i]); d > dt.tol*scale {
							t.Errorf("batch %d, step %d, sequence %d: fused logits differ by %.3g (scale %.3g)", b, s, i, d, scale)
						}
					}
				}
				if gotPC.PerLayer() != 10 || wantPC.PerLayer() <= gotPC.PerLayer() {
					t.Errorf("batch %d: %.1f primitives a layer fused, %.1f composed; want 10 and more", b, gotPC.PerLayer(), wantPC.PerLayer())
				}
			}
		})
	}
}

// gpuModel loads dir on the GPU of an engine with opts, skipping the test
// where there is none.
func gpuModel(t *testing.T, dir string, opts ...Option) *model {
	t.Helper()
	e, err := New(append([]Option{WithDevice("gpu")}, opts...)...)
	if err != nil {
		t.Skipf("no GPU: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return load(t, e, dir)
}

func fusedOn(t *testing.T, m *model) bool {
	t.Helper()
	var on bool
	if err := m.call(func(g *graph) error { on = g.k.fused; return nil }); err != nil {
		t.Fatal(err)
	}
	return on
}

package pyproc

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
)

// TestMaskEncodings: masks of every density cross the protocol in the
// form that suits them and the worker samples only allowed tokens.
func TestMaskEncodings(t *testing.T) {
	e := newEngine(t)
	ctx := context.Background()
	m, err := e.Load(ctx, engine.ModelSpec{ID: "tiny", Path: tiny(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	v := m.Info().VocabSize
	rng := rand.New(rand.NewPCG(1, 2))
	for _, density := range []float64{0.01, 0.5, 0.995} {
		mask := make([]uint64, engine.MaskWords(v))
		for id := 0; id < v; id++ {
			if rng.Float64() < density {
				mask[id>>6] |= 1 << (id & 63)
			}
		}
		mask[0] |= 1 << 1 // never empty
		line := string(appendMask(nil, mask, v))
		wantForm := map[float64]string{0.01: `"a":`, 0.5: `"b":`, 0.995: `"d":`}[density]
		if v >= 256 && !strings.Contains(line, wantForm) {
			t.Errorf("density %v over %d ids encoded as %.40s..., want %s", density, v, line, wantForm)
		}
		id := engine.SeqID(density * 1000)
		prompt := []int32{1, 2, 3}
		if _, err := m.Open(ctx, id, prompt, ""); err != nil {
			t.Fatal(err)
		}
		p := &engine.SamplingParams{Temperature: 1, Seed: 3, HasSeed: true, TopLogprobs: 2, FrequencyPenalty: 1, PresencePenalty: 1, LogitBias: map[int32]float32{1: 2}}
		feed := prompt
		for i := 0; i < 8; i++ {
			out, err := m.Step(ctx, []engine.StepInput{{Seq: id, Tokens: feed, Sample: true, Params: p, Allowed: mask}})
			if err != nil {
				t.Fatal(err)
			}
			if !engine.MaskAllows(mask, out[0].Token) {
				t.Fatalf("density %v: sampled %d outside the mask", density, out[0].Token)
			}
			for _, e := range out[0].Top {
				if !engine.MaskAllows(mask, e.Token) {
					t.Fatalf("density %v: top token %d outside the mask", density, e.Token)
				}
			}
			feed = []int32{out[0].Token}
		}
		m.Free(id, "")
	}
}

// TestMasksRandom runs testdata/masks_test.py: random token sets in every
// form decode on the worker to the tokens PROTOCOL.md says, the batched
// masks sample as a per-row fill does, and a device chain keeps exactly
// the tokens up to the first exit from a loop (the CUDA path's host side,
// which the CPU tests do not reach otherwise).
func TestMasksRandom(t *testing.T) {
	runPyCheck(t, "testdata/masks_test.py", "runtime", "300", "1")
}

// runPyCheck runs a Python check script of testdata with the test
// interpreter and fails unless it reports " passed, 0 failed".
func runPyCheck(t *testing.T, script string, args ...string) {
	t.Helper()
	out, err := exec.Command(python(t), append([]string{script}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	if !strings.Contains(string(out), " passed, 0 failed") {
		t.Fatalf("%s did not report its checks:\n%s", script, out)
	}
}

// BenchmarkAppendMask measures encoding one step's mask over a 128k
// vocabulary in each of its forms, and the bytes it adds to the line.
func BenchmarkAppendMask(b *testing.B) {
	const v = 128256
	rng := rand.New(rand.NewPCG(3, 4))
	for _, density := range []float64{0.001, 0.5, 0.97} {
		mask := make([]uint64, engine.MaskWords(v))
		for id := 0; id < v; id++ {
			if rng.Float64() < density {
				mask[id>>6] |= 1 << (id & 63)
			}
		}
		b.Run(fmt.Sprintf("allowed=%g", density), func(b *testing.B) {
			var buf []byte
			for b.Loop() {
				buf = appendMask(buf[:0], mask, v)
			}
			b.ReportMetric(float64(len(buf)), "bytes/step")
		})
	}
}

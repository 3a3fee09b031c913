//go:build mlx

package mlx

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestGptOssHalfPrecision runs gpt_oss in bfloat16, its experts
// dequantized and in MXFP4 (gather_qmm over bfloat16 inputs), against the
// float32 model's logits.
func TestGptOssHalfPrecision(t *testing.T) {
	e := newEngine(t)
	p := refPrompt(5, 70) // sorted by expert (sortAt), past the window
	dir := func(dtype, quant string) string {
		c := testmodel.TinyFamily("gpt_oss")
		c.DType, c.Quant = dtype, quant
		return writeTiny(t, c)
	}
	for _, quant := range []string{"", testmodel.QuantMXFP4} {
		ref := lastLogits(t, load(t, e, dir("float32", quant)), p)
		m := load(t, e, dir("bfloat16", quant))
		if q := m.w.layers[0].moe.gate.q; (quant == "") != (q == nil) {
			t.Fatalf("%q: experts quantized as %+v", quant, q)
		}
		got := lastLogits(t, m, p)
		diff, scale := maxDiff(got, ref)
		t.Logf("%q bfloat16: max logit difference from float32 %.3f (scale %.2f)", quant, diff, scale)
		if diff > 0.05*scale {
			t.Errorf("%q: bfloat16 logits differ from float32 by %v (scale %v)", quant, diff, scale)
		}
	}
}

// TestGptOssNaNScale: an MXFP4 scale of 0xFF (NaN in E8M0) is refused
// at load as a CheckpointError naming the tensor.
func TestGptOssNaNScale(t *testing.T) {
	const name = "model.layers.3.mlp.experts.down_proj_scales"
	c := testmodel.TinyFamily("gpt_oss")
	c.Quant = testmodel.QuantMXFP4
	dir := writeTiny(t, c)
	path := filepath.Join(dir, "model.safetensors")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(b)
	var h map[string]struct {
		Offsets []int `json:"data_offsets"`
	}
	if err := json.Unmarshal(b[8:8+n], &h); err != nil {
		t.Fatal(err)
	}
	b[8+int(n)+h[name].Offsets[0]+5] = 0xFF
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEngine(t)
	_, err = e.Load(context.Background(), engine.ModelSpec{ID: "nan", Path: dir})
	var ce *engine.CheckpointError
	if !errors.As(err, &ce) || ce.Tensor != name {
		t.Errorf("%v, want a CheckpointError naming %s", err, name)
	}
}

// TestQuantizeGptOss: Engine.Quantize quantizes gpt_oss's attention,
// router and head and leaves its stacked experts float; the result loads
// and stays close to the float model; an MXFP4 checkpoint is refused as
// already quantized.
func TestQuantizeGptOss(t *testing.T) {
	e := newEngine(t)
	src, dst := writeTiny(t, testmodel.TinyFamily("gpt_oss")), t.TempDir()
	if err := e.Quantize(context.Background(), src, dst, 8, 32); err != nil {
		t.Fatal(err)
	}
	q := load(t, e, dst)
	if l := q.w.layers[0]; l.qkv.q == nil || l.moe.router.q == nil || l.moe.gate.q != nil {
		t.Fatalf("quantized: qkv %v, router %v, experts %v", l.qkv.q, l.moe.router.q, l.moe.gate.q)
	}
	mx := testmodel.TinyFamily("gpt_oss")
	mx.Quant = testmodel.QuantMXFP4
	if err := e.Quantize(context.Background(), writeTiny(t, mx), t.TempDir(), 8, 32); !errors.As(err, new(*engine.CheckpointError)) {
		t.Errorf("quantizing MXFP4 experts: %v, want a CheckpointError", err)
	}
	p := refPrompt(6, 40)
	if d, scale := maxDiff(lastLogits(t, q, p), lastLogits(t, load(t, e, src), p)); d > 0.05*scale {
		t.Errorf("8-bit logits differ from float32 by %v (scale %v)", d, scale)
	}
}

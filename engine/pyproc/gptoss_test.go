package pyproc

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/testmodel"
)

// TestHostileMXFP4: gpt_oss checkpoints whose MXFP4 experts are corrupt
// (blocks or scales of the wrong shape, a NaN scale, scales past the
// dtype's range), whose quant_method is unknown, or that claim MXFP4 for
// another family are refused as a CheckpointError naming the tensor or
// field; the worker goes on serving.
func TestHostileMXFP4(t *testing.T) {
	python(t)
	e := newEngine(t)
	const gu = "model.layers.0.mlp.experts.gate_up_proj"
	fill := func(v byte) func([]byte) {
		return func(b []byte) {
			for i := range b {
				b[i] = v
			}
		}
	}
	// TinyFamily("gpt_oss"): 4 experts, gate_up_proj [4, 64, 256] stored
	// as blocks [4, 256, 2, 16] and scales [4, 256, 2].
	for _, h := range []struct {
		name     string
		old, new string // header text replaced (same length)
		tensor   string // or a tensor's bytes edited
		edit     func([]byte)
		quant    any // or quantization_config's quant_method set
		arch     string
		want     string
	}{
		{name: "blocks of the wrong shape", old: `"shape":[4,256,2,16]`, new: `"shape":[4,256,1,32]`, want: gu + "_blocks"},
		{name: "scales of the wrong shape", old: `"shape":[4,256,2]`, new: `"shape":[4,128,4]`, want: gu + "_scales"},
		{name: "scales stored as int8", old: `"dtype":"U8","shape":[4,256,2]`, new: `"dtype":"I8","shape":[4,256,2]`, want: "I8"},
		{name: "a NaN scale", tensor: gu + "_scales", edit: fill(255), want: gu + "_scales"},
		{name: "scales past float32", tensor: gu + "_scales", edit: fill(254), want: gu + "_scales"},
		{name: "an unknown quant_method", quant: "mxfp6", want: "quant_method"},
		{name: "mxfp4 on llama", arch: "llama", want: "mxfp4"},
	} {
		t.Run(h.name, func(t *testing.T) {
			c := testmodel.TinyFamily("gpt_oss")
			c.Quant = testmodel.QuantMXFP4
			dir := t.TempDir()
			if err := testmodel.Write(dir, c); err != nil {
				t.Fatal(err)
			}
			switch {
			case h.tensor != "":
				editTensor(t, dir, h.tensor, h.edit)
			case h.old != "":
				renameTensors(t, dir, h.old, h.new)
			case h.quant != nil:
				editConfig(t, dir, "quantization_config", map[string]any{"quant_method": h.quant})
			case h.arch != "":
				editConfig(t, dir, "model_type", h.arch)
			}
			m, err := e.Load(context.Background(), engine.ModelSpec{ID: "bad", Path: dir})
			if !errors.Is(err, engine.ErrBadCheckpoint) || !strings.Contains(err.Error(), h.want) {
				t.Errorf("%v, want a CheckpointError naming %s", err, h.want)
				if m != nil {
					m.Close()
				}
			}
		})
	}
	m := load(t, e, tiny(t))
	generate(t, m, 1, prompt(1, 5), 3)
}

// TestGptOssSinksEmulated runs testdata/sinks_test.py: gpt_oss's sinks
// inside the CUDA fast paths on the CPU. The sink correction
// (out * sigmoid(L - s)) and the stand-in decode kernel's softmax against
// an explicit sink column (a short window and a fully masked row among
// them); then a tiny gpt_oss through the kernels, the varlen prompt
// attention, decode graphs and the speculated next step, all stood in by
// plain torch, against the plain path: the same tokens, logprobs within
// 1e-4.
func TestGptOssSinksEmulated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gpt_oss")
	if err := testmodel.Write(dir, testmodel.TinyFamily("gpt_oss")); err != nil {
		t.Fatal(err)
	}
	runPyCheck(t, "testdata/sinks_test.py", "runtime", dir)
}

package pyproc

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/engine/enginetest"
	"github.com/mlxserving/mlxserving/internal/reference"
	"github.com/mlxserving/mlxserving/testmodel"
)

// quantCases are the quantized checkpoints the CPU tests serve: every
// layout on TinyQuant (llama), and block FP8 on families whose
// projections load another way (Qwen 3's QK norm, Phi-3's fused
// projections, Qwen 3 MoE's experts: dequantized at load everywhere).
func quantCases() map[string]testmodel.Config {
	cases := map[string]testmodel.Config{}
	for _, q := range testmodel.AllQuants() {
		c := testmodel.TinyQuant()
		c.Quant = q
		cases[q] = c
	}
	for _, arch := range []string{"qwen3", "phi3", "qwen3_moe"} {
		c := testmodel.TinyFamily(arch)
		c.Quant = testmodel.QuantFP8Block
		cases[arch+"-fp8"] = c
	}
	return cases
}

// TestQuantMatchesReference serves each quantized checkpoint on the CPU
// (dequantized at load from the file's bytes) and checks its greedy tokens
// and log-probabilities against the reference's forward pass over the
// same file, which dequantizes independently (internal/reference): the
// same tokens wherever the reference's top two are not a near tie, and
// log-probabilities within 1e-4.
func TestQuantMatchesReference(t *testing.T) {
	py := python(t)
	e := newEngine(t)
	for name, cfg := range quantCases() {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := testmodel.Write(dir, cfg); err != nil {
				t.Fatal(err)
			}
			checkAgainstReference(t, py, e, dir, name)
		})
	}
}

// TestQuantizeFP8 loads a float checkpoint with WithQuantize("fp8") and
// checks it serves what the reference computes over testmodel's
// per-channel FP8 file of the same model: both quantize each row by
// max|row| / 448 in float32 and round to nearest even.
func TestQuantizeFP8(t *testing.T) {
	py := python(t)
	cfg := testmodel.TinyQuant()
	dir, qdir := t.TempDir(), t.TempDir()
	if err := testmodel.Write(dir, cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Quant = testmodel.QuantFP8Channel
	if err := testmodel.Write(qdir, cfg); err != nil {
		t.Fatal(err)
	}
	prompts := [][]int32{prompt(1, 5), prompt(2, 40)}
	ref := runReference(t, py, qdir, prompts, 6)
	e := newEngine(t, WithQuantize("fp8"))
	m := load(t, e, dir)
	defer m.Close()
	compareRuns(t, m, prompts, ref)
	// A checkpoint already quantized is refused with it.
	if m2, err := e.Load(context.Background(), engine.ModelSpec{ID: "twice", Path: qdir}); err == nil {
		m2.Close()
		t.Error("quantize fp8 on an FP8 checkpoint: loaded")
	}
	if _, err := New(context.Background(), WithQuantize("int4")); err == nil {
		t.Error("WithQuantize(int4): no error")
	}
}

// checkAgainstReference loads dir and compares it with the reference.
func checkAgainstReference(t *testing.T, py string, e *Engine, dir, name string) {
	t.Helper()
	prompts := [][]int32{prompt(1, 5), prompt(2, 40), prompt(3, 1)}
	ref := runReference(t, py, dir, prompts, 6)
	m, err := e.Load(context.Background(), engine.ModelSpec{ID: name, Path: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	compareRuns(t, m.(*Model), prompts, ref)
}

// logprobTolerance is how far a float32 log-probability may sit from the
// float64 reference: 1e-4 on the CPU; 5e-4 on CUDA, whose float32
// reductions (cuBLAS tiles, the quantization's row maxima) sum in other
// orders (1.06e-4 seen on an H200 with WithQuantize("fp8")).
func logprobTolerance() float64 {
	if os.Getenv("MLXSERVING_TEST_DEVICE") == "cuda" {
		return 5e-4
	}
	return 1e-4
}

func compareRuns(t *testing.T, m *Model, prompts [][]int32, ref []reference.Run) {
	t.Helper()
	for i, p := range prompts {
		toks, lps := generateChunked(t, m, engine.SeqID(i), p, len(ref[i].Tokens), 0)
		for k := range toks {
			if toks[k] != ref[i].Tokens[k] {
				if ref[i].Gaps[k] < 1e-3 {
					break // a near tie: either token is right; the rest diverges
				}
				t.Fatalf("prompt %d token %d: %d, reference %d (gap %.4f)", i, k, toks[k], ref[i].Tokens[k], ref[i].Gaps[k])
			}
			if d := math.Abs(float64(lps[k]) - ref[i].Logprobs[k]); d > logprobTolerance() {
				t.Errorf("prompt %d token %d: logprob %v, reference %v", i, k, lps[k], ref[i].Logprobs[k])
			}
		}
	}
}

// TestHostileQuantConfigs: every edit of enginetest.HostileQuantConfigs
// this engine does not serve is refused as a CheckpointError naming the
// field, and so are the corrupt tensors of hostileQuantTensors; the
// worker goes on serving.
func TestHostileQuantConfigs(t *testing.T) {
	python(t)
	e := newEngine(t)
	refused := func(name, dir, want string) {
		t.Helper()
		m, err := e.Load(context.Background(), engine.ModelSpec{ID: "bad", Path: dir})
		if !errors.Is(err, engine.ErrBadCheckpoint) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want a CheckpointError naming %s", name, err, want)
			if m != nil {
				m.Close()
			}
		}
	}
	for _, h := range enginetest.HostileQuantConfigs() {
		if slices.Contains(h.Served, e.Name()) {
			continue
		}
		dir := t.TempDir()
		if err := h.Write(dir); err != nil {
			t.Fatal(err)
		}
		refused(h.Name, dir, h.Key)
	}
	for _, h := range hostileQuantTensors() {
		cfg := testmodel.TinyQuant()
		cfg.Quant = h.quant
		dir := t.TempDir()
		if err := testmodel.Write(dir, cfg); err != nil {
			t.Fatal(err)
		}
		if h.tensor != "" {
			editTensor(t, dir, h.tensor, h.edit)
		} else {
			renameTensors(t, dir, h.old, h.new)
		}
		refused(h.quant+": "+h.name, dir, h.want)
	}
	m := load(t, e, tiny(t))
	generate(t, m, 1, prompt(1, 5), 3)
}

// hostileTensor is a corrupt tensor of a quantized checkpoint: tensor's
// bytes changed by edit or, when tensor is empty, header text old
// replaced by new (same length); the CheckpointError names want.
type hostileTensor struct {
	name, quant    string
	tensor         string
	edit           func([]byte)
	old, new, want string
}

// hostileQuantTensors are the corrupt tensors TestHostileQuantConfigs
// feeds the engine.
func hostileQuantTensors() []hostileTensor {
	const (
		blockScale = "model.layers.1.mlp.up_proj.weight_scale_inv"
		scales     = "model.layers.0.mlp.down_proj.scales"
		gidx       = "model.layers.0.mlp.down_proj.g_idx"
		packed     = "model.layers.0.mlp.down_proj.weight_"
	)
	u32 := func(at int, v uint32) func([]byte) {
		return func(b []byte) { binary.LittleEndian.PutUint32(b[4*at:], v) }
	}
	f32NaN := u32(1, math.Float32bits(float32(math.NaN())))
	inf16 := func(b []byte) { binary.LittleEndian.PutUint16(b[2:], 0xFC00) } // -inf in float16
	moved := func(b []byte) {                                                // input 5 to the next group: one of 129 inputs, one of 127
		binary.LittleEndian.PutUint32(b[20:], (binary.LittleEndian.Uint32(b[20:])+1)%4)
	}
	hs := []hostileTensor{
		{name: "a NaN scale", quant: testmodel.QuantFP8Block, tensor: blockScale, edit: f32NaN, want: blockScale},
		// up_proj [512, 256]: 4 x 2 blocks.
		{name: "a scale of the wrong shape", quant: testmodel.QuantFP8Block, old: `"shape":[4,2]`, new: `"shape":[2,4]`, want: "weight_scale_inv"},
		// down_proj: 512 inputs, 4 groups.
		{name: "g_idx past the last group", quant: testmodel.QuantGPTQActOrder, tensor: gidx, edit: u32(5, 4), want: gidx},
		{name: "groups of 129 and 127 inputs", quant: testmodel.QuantGPTQActOrder, tensor: gidx, edit: moved, want: gidx},
		{name: "groups of 129 and 127 inputs", quant: testmodel.QuantW4A16ActOrder, tensor: packed + "g_idx", edit: moved, want: packed + "g_idx"},
		{name: "a NaN scale", quant: testmodel.QuantW4A16, tensor: packed + "scale", edit: f32NaN, want: packed + "scale"},
		{name: "weight_shape of another weight", quant: testmodel.QuantW4A16, tensor: packed + "shape", edit: u32(0, 7), want: packed + "shape"},
		{name: "no weight_zero_point", quant: testmodel.QuantW4A16Asym, old: "down_proj.weight_zero_point", new: "down_proj.weight_zero_poinX", want: packed + "zero_point"},
	}
	for _, q := range []string{testmodel.QuantAWQ, testmodel.QuantGPTQ} {
		hs = append(hs, hostileTensor{name: "an infinite scale", quant: q, tensor: scales, edit: inf16, want: scales})
	}
	return hs
}

// editTensor lets edit change the bytes of tensor name in dir's
// model.safetensors.
func editTensor(t *testing.T, dir, name string, edit func([]byte)) {
	t.Helper()
	path := filepath.Join(dir, "model.safetensors")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := 8 + int(binary.LittleEndian.Uint64(raw))
	var hdr map[string]struct {
		Offsets [2]int `json:"data_offsets"`
	}
	if err := json.Unmarshal(raw[8:n], &hdr); err != nil {
		t.Fatal(err)
	}
	e, ok := hdr[name]
	if !ok {
		t.Fatalf("no tensor %s", name)
	}
	edit(raw[n+e.Offsets[0] : n+e.Offsets[1]])
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestQuantRuntime runs testdata/quant_test.py: FP8 rounding against every
// e4m3 value and tie, int4 packing, the concatenation of quantized
// projections, every layout's projections in the form the CUDA path keeps
// them (dequantizing to what the CPU path loads), and on CUDA the Triton
// GEMMs against the dequantized product.
func TestQuantRuntime(t *testing.T) {
	args := []string{"runtime"}
	for _, q := range testmodel.AllQuants() {
		cfg := testmodel.TinyQuant()
		cfg.Quant = q
		dir := t.TempDir()
		if err := testmodel.Write(dir, cfg); err != nil {
			t.Fatal(err)
		}
		args = append(args, dir)
	}
	runPyCheck(t, "testdata/quant_test.py", args...)
}

// TestQuantW8A8 runs testdata/w8a8_test.py on the CPU: the activations'
// per-token FP8 quantization in torch ops (scales, codes, rows
// independent of their batch), QWeight.forward's choice between W8A8 and
// the weight-only GEMM (by row count, layout and the check at load, the
// kernels stood in by plain torch) and the check's fallbacks.
func TestQuantW8A8(t *testing.T) {
	runPyCheck(t, "testdata/w8a8_test.py", "runtime")
}

// TestQuantW8A8CUDA (MLXSERVING_TEST_DEVICE=cuda only) runs
// testdata/w8a8_test.py --cuda: the Triton activation quantizer and the
// W8A8 products against torch and the dequantized product, batch
// invariance and graph capture, then block and per-channel FP8 models
// served in bfloat16 with W8A8 against the CPU's float32 emulation of it
// (and with it off against the plain dequantized model). The models are
// TinyQuant widened so that every projection fits the block path (K a
// multiple of 512).
func TestQuantW8A8CUDA(t *testing.T) {
	if os.Getenv("MLXSERVING_TEST_DEVICE") != "cuda" {
		t.Skip("CUDA only (MLXSERVING_TEST_DEVICE=cuda)")
	}
	args := []string{"runtime", "--cuda"}
	for _, q := range []string{testmodel.QuantFP8Block, testmodel.QuantFP8Channel} {
		cfg := testmodel.TinyQuant()
		cfg.Hidden, cfg.Intermediate, cfg.Quant = 512, 1024, q
		dir := filepath.Join(t.TempDir(), q)
		if err := testmodel.Write(dir, cfg); err != nil {
			t.Fatal(err)
		}
		args = append(args, dir)
	}
	runPyCheck(t, "testdata/w8a8_test.py", args...)
}

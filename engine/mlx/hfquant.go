package mlx

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"strings"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/safetensors"
)

// hfQuant is the quantization_config of a quantized checkpoint as
// published for transformers, which the engine converts at load:
//
//   - AWQ (quant_method "awq", version "gemm", 4 bits, zero_point) and GPTQ
//     ("gptq", 4 bits, desc_act false, auto-gptq's stored zero - 1) are
//     requantized to MLX's affine 4-bit with the same group size: the same
//     4-bit values, repacked along the input, scale as stored and bias =
//     -scale * zero, so w = scale * q + bias is the checkpoint's
//     scale * (q - zero): exactly in float32; rounding the bias in a
//     half-precision model's dtype moves each weight by at most 2^-11 of
//     |bias|.
//   - FP8 (quant_method "fp8" with weight_block_size or a weight_scale, and
//     compressed-tensors "float-quantized") is dequantized to the model's
//     float dtype: MLX has no FP8 matmul.
type hfQuant struct {
	Method string // "awq", "gptq" or "fp8"
	Group  int    // 4-bit group size
	Block  [2]int // FP8 weight_block_size; zero for per-tensor or per-channel weight_scale
}

// hfMethod reports whether quantization_config q is a transformers
// layout (rather than MLX's own "quantization" entry).
func hfMethod(q map[string]any) bool {
	m, _ := q["quant_method"].(string)
	return m != "" && m != "mlx"
}

// parseHFQuant reads q, returning the reason (naming the field) when the
// engine cannot load the layout.
func parseHFQuant(q map[string]any) (*hfQuant, string) {
	bad := func(field string, got any, want string) (*hfQuant, string) {
		return nil, fmt.Sprintf("quantization_config.%s %v: unsupported (want %s)", field, got, want)
	}
	num := func(k string) (int, bool) {
		v, ok := q[k].(float64)
		return int(v), ok && v == math.Trunc(v)
	}
	switch method, _ := q["quant_method"].(string); method {
	case "awq", "gptq":
		if b, _ := num("bits"); b != 4 {
			return bad("bits", q["bits"], "4")
		}
		g, _ := num("group_size")
		if _, set := q["group_size"]; !set && method == "awq" {
			g = 128
		}
		if g != 32 && g != 64 && g != 128 {
			return bad("group_size", q["group_size"], "32, 64 or 128")
		}
		if method == "awq" {
			if v, ok := q["version"].(string); ok && strings.ToLower(v) != "gemm" {
				return bad("version", v, "gemm (AutoAWQ's GEMM packing)")
			}
			if zp, ok := q["zero_point"]; ok && zp != true {
				return bad("zero_point", zp, "true")
			}
		} else {
			if da, ok := q["desc_act"]; ok && da != false {
				return bad("desc_act", da, "false (act-order checkpoints are not supported)")
			}
			if f, ok := q["checkpoint_format"]; ok && f != "gptq" {
				return bad("checkpoint_format", f, "gptq (auto-gptq's v1 zeros)")
			}
		}
		return &hfQuant{Method: method, Group: g}, ""
	case "fp8":
		if f, ok := q["fmt"]; ok && f != "e4m3" {
			return bad("fmt", f, "e4m3")
		}
		h := &hfQuant{Method: "fp8"}
		if b, ok := q["weight_block_size"]; ok && b != nil {
			// Multiples of 16, as every published checkpoint's (128) and
			// the torch engine's kernels have them.
			bs, ok := b.([]any)
			if !ok || len(bs) != 2 {
				return bad("weight_block_size", b, "two positive multiples of 16")
			}
			for i, v := range bs {
				f, ok := v.(float64)
				if !ok || f <= 0 || f != math.Trunc(f) || int(f)%16 != 0 {
					return bad("weight_block_size", b, "two positive multiples of 16")
				}
				h.Block[i] = int(f)
			}
		}
		return h, ""
	case "compressed-tensors":
		if f := q["format"]; f != "float-quantized" {
			return bad("format", f, "float-quantized (FP8)")
		}
		return &hfQuant{Method: "fp8"}, "" // scales of any shape: read from the file (hfFP8)
	default:
		return bad("quant_method", q["quant_method"], "mlx, awq, gptq, fp8 or compressed-tensors")
	}
}

// hfTensor is a tensor the engine makes from a quantized checkpoint's
// tensors at load: U32 (MLX-packed 4-bit) or F32 (scales, biases, FP8
// dequantized) values of Shape.
type hfTensor struct {
	Shape []int
	U32   []uint32
	F32   []float32
}

// convertHF rewrites the manifest of a checkpoint quantized as q into the
// tensors the engine loads (MLX affine for 4-bit, float for FP8, in the
// dtype of the float tensors, dtype), and returns how to make each
// rewritten tensor from the files. Corrupt tensors (wrong shapes, NaN or
// negative scales, NaN FP8 values) are CheckpointErrors.
func convertHF(q *hfQuant, man map[string]tensorInfo, dtype string) (map[string]tensorInfo, map[string]func() (hfTensor, error), error) {
	out := make(map[string]tensorInfo, len(man))
	for k, v := range man {
		out[k] = v
	}
	make_ := map[string]func() (hfTensor, error){}
	for name, t := range man {
		switch {
		case q.Method != "fp8" && strings.HasSuffix(name, ".qweight"):
			base := strings.TrimSuffix(name, "qweight")
			out2, in, err := int4Shape(q, man, base)
			if err != nil {
				return nil, nil, err
			}
			for _, s := range []string{"qweight", "qzeros", "scales", "g_idx"} {
				delete(out, base+s)
			}
			ng := in / q.Group
			out[base+"weight"] = tensorInfo{File: t.File, DType: "U32", Shape: []int{out2, in / 8}}
			out[base+"scales"] = tensorInfo{File: t.File, DType: dtype, Shape: []int{out2, ng}}
			out[base+"biases"] = tensorInfo{File: t.File, DType: dtype, Shape: []int{out2, ng}}
			var conv *[3]hfTensor
			once := func(i int) func() (hfTensor, error) {
				return func() (hfTensor, error) {
					if conv == nil {
						c, err := requant4(q, man, base, out2, in)
						if err != nil {
							return hfTensor{}, err
						}
						conv = &c
					}
					r := conv[i]
					conv[i] = hfTensor{}
					return r, nil
				}
			}
			make_[base+"weight"], make_[base+"scales"], make_[base+"biases"] = once(0), once(1), once(2)
		case q.Method == "fp8" && t.DType == "F8_E4M3":
			base := strings.TrimSuffix(name, ".weight")
			scale := base + ".weight_scale_inv"
			if _, ok := man[scale]; !ok {
				scale = base + ".weight_scale"
			}
			if _, ok := man[scale]; !ok || len(t.Shape) != 2 {
				return nil, nil, &engine.CheckpointError{Path: t.File, Tensor: name, Reason: "F8_E4M3 weight without a 2-D shape and weight_scale_inv or weight_scale"}
			}
			delete(out, scale)
			out[name] = tensorInfo{File: t.File, DType: dtype, Shape: t.Shape}
			make_[name] = func() (hfTensor, error) { return dequantFP8(q, man, name, scale) }
		}
	}
	return out, make_, nil
}

// int4Shape checks the shapes of an AWQ or GPTQ module's tensors and
// returns its output and input sizes.
func int4Shape(q *hfQuant, man map[string]tensorInfo, base string) (out, in int, err error) {
	qw, qz, sc := man[base+"qweight"], man[base+"qzeros"], man[base+"scales"]
	bad := func(tensor, reason string) error {
		return &engine.CheckpointError{Path: qw.File, Tensor: base + tensor, Reason: reason}
	}
	if len(qw.Shape) != 2 || len(sc.Shape) != 2 || len(qz.Shape) != 2 {
		return 0, 0, bad("qweight", "qweight, qzeros and scales must all be there, 2-D")
	}
	out, in = sc.Shape[1], sc.Shape[0]*q.Group
	want := []int{in / 8, out}
	if q.Method == "awq" {
		want = []int{in, out / 8}
	}
	switch {
	case out%8 != 0 || qw.Shape[0] != want[0] || qw.Shape[1] != want[1] || qw.DType != "I32":
		return 0, 0, bad("qweight", fmt.Sprintf("%s %v does not fit scales %v (want I32 %v)", qw.DType, qw.Shape, sc.Shape, want))
	case qz.Shape[0] != in/q.Group || qz.Shape[1] != out/8 || qz.DType != "I32":
		return 0, 0, bad("qzeros", fmt.Sprintf("%s %v: want I32 [%d %d]", qz.DType, qz.Shape, in/q.Group, out/8))
	case sc.DType != "F16" && sc.DType != "BF16" && sc.DType != "F32":
		return 0, 0, bad("scales", "dtype "+sc.DType+": want F16, BF16 or F32")
	}
	if g, ok := man[base+"g_idx"]; ok && (len(g.Shape) != 1 || g.Shape[0] != in) {
		return 0, 0, bad("g_idx", fmt.Sprintf("shape %v: want [%d]", g.Shape, in))
	}
	return out, in, nil
}

// requant4 makes the MLX affine tensors (packed weight [out, in/8],
// scales and biases [out, in/g]) of an AWQ or GPTQ module.
func requant4(q *hfQuant, man map[string]tensorInfo, base string, out, in int) ([3]hfTensor, error) {
	var r [3]hfTensor
	qw, err := readU32(man, base+"qweight")
	if err != nil {
		return r, err
	}
	qz, err := readU32(man, base+"qzeros")
	if err != nil {
		return r, err
	}
	sc, err := readFloats(man, base+"scales")
	if err != nil {
		return r, err
	}
	if q.Method == "gptq" {
		if _, ok := man[base+"g_idx"]; ok {
			gi, err := readU32(man, base+"g_idx")
			if err != nil {
				return r, err
			}
			for k, g := range gi {
				if int(g) != k/q.Group {
					return r, &engine.CheckpointError{Path: man[base+"g_idx"].File, Tensor: base + "g_idx", Reason: "g_idx is not input / group_size (act order)"}
				}
			}
		}
	}
	ng := in / q.Group
	// nib(words, row, col, n): the 4-bit value at column col of a row of
	// words n wide, in the layout's packing order.
	awqNibble := [8]int{0, 4, 1, 5, 2, 6, 3, 7} // column j of a word is nibble awqNibble[j]
	zero := func(g, o int) float32 {
		w := qz[g*(out/8)+o/8]
		if q.Method == "awq" {
			return float32(w >> (4 * awqNibble[o%8]) & 15)
		}
		return float32(w>>(4*(o%8))&15) + 1 // auto-gptq stores zero - 1
	}
	val := func(k, o int) uint32 {
		if q.Method == "awq" {
			return qw[k*(out/8)+o/8] >> (4 * awqNibble[o%8]) & 15
		}
		return qw[(k/8)*out+o] >> (4 * (k % 8)) & 15
	}
	packed := make([]uint32, out*in/8)
	scales, biases := make([]float32, out*ng), make([]float32, out*ng)
	for o := range out {
		for k := range in {
			packed[o*(in/8)+k/8] |= val(k, o) << (4 * (k % 8)) // MLX: element j of a word in bits 4j
		}
		for g := range ng {
			s := sc[g*out+o]
			if !(s >= 0) || math.IsInf(float64(s), 0) {
				return r, &engine.CheckpointError{Path: man[base+"scales"].File, Tensor: base + "scales", Reason: "scale holds NaN, infinite or negative values"}
			}
			scales[o*ng+g], biases[o*ng+g] = s, -s*zero(g, o)
		}
	}
	r[0] = hfTensor{Shape: []int{out, in / 8}, U32: packed}
	r[1] = hfTensor{Shape: []int{out, ng}, F32: scales}
	r[2] = hfTensor{Shape: []int{out, ng}, F32: biases}
	return r, nil
}

// dequantFP8 is an FP8 weight times its scales: per block of the
// scale's grid (weight_scale_inv, or a 2-D weight_scale), per output
// channel ([out, 1] or [out]) or per tensor (one value).
func dequantFP8(q *hfQuant, man map[string]tensorInfo, name, scale string) (hfTensor, error) {
	t, st := man[name], man[scale]
	out, in := t.Shape[0], t.Shape[1]
	raw, err := readRaw(man, name)
	if err != nil {
		return hfTensor{}, err
	}
	s, err := readFloats(man, scale)
	if err != nil {
		return hfTensor{}, err
	}
	bad := func(reason string) (hfTensor, error) {
		return hfTensor{}, &engine.CheckpointError{Path: st.File, Tensor: scale, Reason: reason}
	}
	for _, v := range s {
		if !(v >= 0) || math.IsInf(float64(v), 0) {
			return bad("scale holds NaN, infinite or negative values")
		}
	}
	// The scale of weight (o, k): s[(o/bo)*cols + k/bk].
	bo, bk, cols := out, in, 1
	switch n := len(s); {
	case n == 1:
	case n == out && (len(st.Shape) == 1 || st.Shape[1] == 1):
		bo = 1
	case len(st.Shape) == 2:
		bo, bk = q.Block[0], q.Block[1]
		if bo == 0 { // compressed-tensors' block strategy: the grid tells the block
			bo, bk = -(-out / st.Shape[0]), -(-in / st.Shape[1])
		}
		cols = st.Shape[1]
		if st.Shape[0] != -(-out/bo) || cols != -(-in/bk) {
			return bad(fmt.Sprintf("shape %v does not fit weight [%d %d] in blocks of [%d %d]", st.Shape, out, in, bo, bk))
		}
	default:
		return bad(fmt.Sprintf("shape %v does not fit weight [%d %d]", st.Shape, out, in))
	}
	w := make([]float32, out*in)
	for o := range out {
		for k := range in {
			b := raw[o*in+k]
			if b&0x7F == 0x7F {
				return hfTensor{}, &engine.CheckpointError{Path: t.File, Tensor: name, Reason: "F8_E4M3 weight holds NaN"}
			}
			w[o*in+k] = e4m3Values[b] * s[(o/bo)*cols+k/bk]
		}
	}
	return hfTensor{Shape: []int{out, in}, F32: w}, nil
}

// e4m3Values is the value of every float8 e4m3fn byte (0x7f, 0xff: NaN).
var e4m3Values = func() (t [256]float32) {
	for b := range 256 {
		e, m := b>>3&15, float64(b&7)
		v := math.Ldexp(1+m/8, e-7)
		if e == 0 {
			v = math.Ldexp(m/8, -6)
		}
		if b&0x7F == 0x7F {
			v = math.NaN()
		}
		if b&0x80 != 0 {
			v = -v
		}
		t[b] = float32(v)
	}
	return t
}()

// readRaw reads tensor name's bytes from its file.
func readRaw(man map[string]tensorInfo, name string) ([]byte, error) {
	t := man[name]
	h, err := safetensors.ReadFile(t.File)
	if err != nil {
		return nil, err
	}
	e, ok := h.Tensors[name]
	if !ok {
		return nil, &engine.CheckpointError{Path: t.File, Tensor: name, Reason: "missing"}
	}
	f, err := os.Open(t.File)
	if err != nil {
		return nil, &engine.CheckpointError{Path: t.File, Reason: err.Error()}
	}
	defer f.Close()
	b := make([]byte, e.End-e.Begin)
	if _, err := f.ReadAt(b, h.DataOffset+e.Begin); err != nil {
		return nil, &engine.CheckpointError{Path: t.File, Tensor: name, Reason: err.Error()}
	}
	return b, nil
}

func readU32(man map[string]tensorInfo, name string) ([]uint32, error) {
	b, err := readRaw(man, name)
	if err != nil {
		return nil, err
	}
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out, nil
}

// readFloats reads an F32, F16 or BF16 tensor as float32.
func readFloats(man map[string]tensorInfo, name string) ([]float32, error) {
	b, err := readRaw(man, name)
	if err != nil {
		return nil, err
	}
	switch dt := man[name].DType; dt {
	case "F32":
		out := make([]float32, len(b)/4)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return out, nil
	case "BF16", "F16":
		out := make([]float32, len(b)/2)
		for i := range out {
			h := binary.LittleEndian.Uint16(b[2*i:])
			if dt == "BF16" {
				out[i] = math.Float32frombits(uint32(h) << 16)
			} else {
				out[i] = halfValue(h)
			}
		}
		return out, nil
	default:
		return nil, &engine.CheckpointError{Path: man[name].File, Tensor: name, Reason: "dtype " + dt + ": want F32, F16 or BF16"}
	}
}

// halfValue is the value of IEEE half h.
func halfValue(h uint16) float32 {
	exp, mant := int(h>>10&0x1F), float64(h&0x3FF)
	var v float64
	switch exp {
	case 0:
		v = math.Ldexp(mant/1024, -14)
	case 31:
		v = math.Inf(1)
		if mant != 0 {
			v = math.NaN()
		}
	default:
		v = math.Ldexp(1+mant/1024, exp-15)
	}
	if h&0x8000 != 0 {
		v = -v
	}
	return float32(v)
}

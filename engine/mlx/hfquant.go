package mlx

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/safetensors"
)

// hfQuant is the quantization_config of a quantized checkpoint as
// published for transformers, which the engine converts at load:
//
//   - 4-bit integer layouts are requantized to MLX's affine 4-bit with the
//     same group size (hfint4.go): AWQ (quant_method "awq", version
//     "gemm", zero_point), GPTQ ("gptq", auto-gptq's v1 zeros stored as
//     zero - 1 or GPTQModel's checkpoint_format "gptq_v2", with or without
//     act order) and compressed-tensors "pack-quantized" (int, 4 bits,
//     strategy "group", symmetric or with weight_zero_point). The same
//     4-bit values, repacked along the input, scale as stored and bias =
//     -scale * zero, so w = scale * q + bias is the checkpoint's
//     scale * (q - zero): exactly in float32 where the scales are half
//     precision, as published checkpoints store them (float32 scales round
//     scale * q and the bias, by 2^-24 of them). A float16 or bfloat16
//     model holds scales and biases in its dtype: what it cannot hold (a
//     float16 scale in bfloat16, most biases) rounds, by at most 2^-11
//     (float16) or 2^-8 (bfloat16) of that term; a symmetric layout's
//     bias, -8 * scale, is exact wherever its scale is. Act order (GPTQ's
//     g_idx not k / group_size) is served exactly too: see actOrder.
//   - FP8 (quant_method "fp8" with weight_block_size or a weight_scale, and
//     compressed-tensors "float-quantized") is dequantized to the model's
//     float dtype: MLX has no FP8 matmul.
type hfQuant struct {
	Method string // "awq", "gptq", "pack-quantized" (compressed-tensors int4) or "fp8"
	Group  int    // 4-bit group size
	Block  [2]int // FP8 weight_block_size; zero for per-tensor or per-channel weight_scale
	// ZeroOffset is added to GPTQ's stored zeros: 1 for auto-gptq's v1
	// format (which stores zero - 1), 0 for GPTQModel's gptq_v2.
	ZeroOffset uint32
	// Asym is compressed-tensors' symmetric false: the zero points are in
	// weight_zero_point; when false the zero is 0.
	Asym bool
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
	num := func(k string) (int, bool) {
		v, ok := q[k].(float64)
		return int(v), ok && v == math.Trunc(v)
	}
	switch method, _ := q["quant_method"].(string); method {
	case "awq", "gptq":
		if b, _ := num("bits"); b != 4 {
			return refuse("bits", q["bits"], "4")
		}
		g, _ := num("group_size")
		if _, set := q["group_size"]; !set && method == "awq" {
			g = 128
		}
		if !int4Group(g) {
			return refuse("group_size", q["group_size"], "32, 64 or 128")
		}
		h := &hfQuant{Method: method, Group: g}
		if method == "awq" {
			if v, ok := q["version"].(string); ok && strings.ToLower(v) != "gemm" {
				return refuse("version", v, "gemm (AutoAWQ's GEMM packing)")
			}
			if zp, ok := q["zero_point"]; ok && zp != true {
				return refuse("zero_point", zp, "true")
			}
			return h, ""
		}
		switch f, ok := q["checkpoint_format"]; {
		case !ok || f == "gptq":
			h.ZeroOffset = 1
		case f == "gptq_v2":
		default:
			return refuse("checkpoint_format", f, "gptq (auto-gptq's v1 zeros) or gptq_v2 (GPTQModel's)")
		}
		if m, ok := q["is_marlin_format"]; ok && m != false {
			return refuse("is_marlin_format", m, "false")
		}
		if p, ok := q["pack_dtype"]; ok && p != "int32" {
			return refuse("pack_dtype", p, "int32")
		}
		return h, "" // desc_act either way: g_idx tells each input's group
	case "fp8":
		if f, ok := q["fmt"]; ok && f != "e4m3" {
			return refuse("fmt", f, "e4m3")
		}
		h := &hfQuant{Method: "fp8"}
		if b, ok := q["weight_block_size"]; ok && b != nil {
			// Multiples of 16, as every published checkpoint's (128) and
			// the torch engine's kernels have them.
			bs, ok := b.([]any)
			if !ok || len(bs) != 2 {
				return refuse("weight_block_size", b, "two positive multiples of 16")
			}
			for i, v := range bs {
				f, ok := v.(float64)
				if !ok || f <= 0 || f != math.Trunc(f) || int(f)%16 != 0 {
					return refuse("weight_block_size", b, "two positive multiples of 16")
				}
				h.Block[i] = int(f)
			}
		}
		return h, ""
	case "mxfp4": // gpt-oss's experts, read as MLX's mxfp4 (gptoss.go)
		return &hfQuant{Method: "mxfp4"}, ""
	case "compressed-tensors":
		if sp, ok := q["sparsity_config"].(map[string]any); ok && sp["format"] != nil && sp["format"] != "dense" {
			return refuse("sparsity_config.format", sp["format"], "dense (sparse-compressed weights are not supported)")
		}
		switch f := q["format"]; f {
		case "float-quantized":
			return &hfQuant{Method: "fp8"}, "" // scales of any shape: read from the file (dequantFP8)
		case "pack-quantized":
			return parsePacked(q)
		default:
			return refuse("format", f, "float-quantized (FP8) or pack-quantized (int4)")
		}
	default:
		return refuse("quant_method", q["quant_method"], "mlx, awq, gptq, fp8, compressed-tensors or mxfp4")
	}
}

// refuse is the reason quantization_config's field holding got is not
// served.
func refuse(field string, got any, want string) (*hfQuant, string) {
	return nil, fmt.Sprintf("quantization_config.%s %v: unsupported (want %s)", field, got, want)
}

// int4Group reports whether MLX's affine 4-bit has groups of g.
func int4Group(g int) bool { return g == 32 || g == 64 || g == 128 }

// parsePacked reads compressed-tensors' pack-quantized config_groups:
// every group's weights int, 4 bits, strategy group, static, alike (the
// engine does not match the groups' targets to modules). Activation
// scales, if any, are not used: the engine computes in float.
func parsePacked(q map[string]any) (*hfQuant, string) {
	groups, ok := q["config_groups"].(map[string]any)
	if !ok || len(groups) == 0 {
		return refuse("config_groups", q["config_groups"], "an object of quantization groups")
	}
	names := make([]string, 0, len(groups))
	for n := range groups {
		names = append(names, n)
	}
	slices.Sort(names)
	var h *hfQuant
	for _, n := range names {
		field := "config_groups." + n + ".weights"
		g, _ := groups[n].(map[string]any)
		w, ok := g["weights"].(map[string]any)
		if !ok {
			return refuse(field, g["weights"], "an object")
		}
		if w["type"] != "int" || w["num_bits"] != 4.0 {
			return nil, fmt.Sprintf("quantization_config.format pack-quantized with %s type %v, num_bits %v: unsupported (want 4-bit int)",
				field, w["type"], w["num_bits"])
		}
		if s := w["strategy"]; s != "group" {
			return refuse(field+".strategy", s, "group")
		}
		gs, _ := w["group_size"].(float64)
		if !int4Group(int(gs)) || gs != math.Trunc(gs) {
			return refuse(field+".group_size", w["group_size"], "32, 64 or 128")
		}
		if d := w["dynamic"]; d != nil && d != false {
			return refuse(field+".dynamic", d, "false")
		}
		switch a := w["actorder"]; a {
		case nil, false, true, "weight", "static", "group", "dynamic": // weight_g_idx, if any, tells the groups
		default:
			return refuse(field+".actorder", a, "null, weight, static, group or dynamic")
		}
		if a := g["input_activations"]; a != nil { // W4A8 and the like: not weight-only
			return refuse("config_groups."+n+".input_activations", a, "null (weight-only int4)")
		}
		this := &hfQuant{Method: "pack-quantized", Group: int(gs), Asym: w["symmetric"] == false}
		if h != nil && *h != *this {
			return refuse("config_groups", "of different weight schemes", "one scheme for every group")
		}
		h = this
	}
	return h, ""
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
// tensors the engine loads (MLX affine for 4-bit, with each act-order
// module's input order as name.perm; float for FP8, in the dtype of the
// float tensors, dtype), and returns how to make each rewritten tensor
// from the files. Corrupt tensors (missing, wrong shapes, NaN or negative
// scales, NaN FP8 values, g_idx groups MLX cannot hold) are
// CheckpointErrors.
func convertHF(q *hfQuant, man map[string]tensorInfo, dtype string) (map[string]tensorInfo, map[string]func() (hfTensor, error), error) {
	out := make(map[string]tensorInfo, len(man))
	for k, v := range man {
		out[k] = v
	}
	make_ := map[string]func() (hfTensor, error){}
	if q.Method == "mxfp4" { // loaded as stored
		return out, make_, nil
	}
	for name, t := range man {
		switch {
		case q.Method != "fp8" && strings.HasSuffix(name, "."+q.names().packed):
			if err := convertInt4(q, man, out, make_, strings.TrimSuffix(name, q.names().packed), dtype); err != nil {
				return nil, nil, err
			}
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

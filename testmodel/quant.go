package testmodel

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
)

// The quantized layouts Write can produce (Config.Quant). Each writes the
// decoder layers' linear weights (q, k, v, o, gate, up, down and their
// fused or expert forms) as the published checkpoints store them, and
// leaves the embedding, the norms, MoE routers and lm_head in
// Config.DType, as those checkpoints do. The quantized values are those
// of the same Config without Quant, rounded to DType and then quantized
// by round-to-nearest, so a test can compare with the float model.
const (
	// QuantFP8Block is quant_method "fp8" with weight_block_size [128,
	// 128] (Qwen3-*-FP8, DeepSeek-V3): weight F8_E4M3 [out, in] and
	// weight_scale_inv F32 [ceil(out/128), ceil(in/128)]; a block's
	// weights are fp8 * scale_inv, scale_inv = max|w| / 448.
	QuantFP8Block = "fp8"
	// QuantFP8Channel is compressed-tensors "float-quantized" as
	// RedHatAI's FP8-dynamic checkpoints have it: weight F8_E4M3 [out, in]
	// and weight_scale [out, 1] in DType (max|row| / 448), dynamic
	// per-token activation scales, ignore ["lm_head"].
	QuantFP8Channel = "fp8-channel"
	// QuantAWQ is AutoAWQ's GEMM layout, 4 bits, groups of 128 along the
	// input, asymmetric: qweight I32 [in, out/8] and qzeros I32 [in/128,
	// out/8] packed in AWQ's order (nibble i of a word holds column
	// 8c + [0,2,4,6,1,3,5,7][i]), scales F16 [in/128, out]; w = (q - z) *
	// s with s = (max - min) / 15, z = round(-min / s).
	QuantAWQ = "awq"
	// QuantGPTQ is GPTQ's layout (auto-gptq, desc_act false, sym true), 4
	// bits, groups of 128: qweight I32 [in/8, out] (nibble j of row r is
	// input 8r + j), qzeros I32 [in/128, out/8] (nibble j of column c is
	// output 8c + j) holding zero - 1 as auto-gptq's "v1" format stores
	// it (8 - 1 = 7 for symmetric 4-bit), scales F16 [in/128, out], g_idx
	// I32 [in] (k / 128); w = (q - (stored + 1)) * s, s = 2 max|w| / 15.
	// Values are rounded to nearest, not GPTQ's error-compensating
	// solve: the layout is what matters here.
	QuantGPTQ = "gptq"
)

// QuantGroup is the group (and FP8 block) size of every quantized layout.
const QuantGroup = 128

// Quants lists the quantized layouts Write can produce.
func Quants() []string { return []string{QuantFP8Block, QuantFP8Channel, QuantAWQ, QuantGPTQ} }

// TinyQuant is Tiny with every linear dimension a multiple of 128, as the
// 4-bit layouts need (groups of 128 along the input): hidden size 256, 4
// heads of 64 over 2 key/value heads, MLP width 512, 2 layers, float32.
func TinyQuant() Config {
	c := Tiny()
	c.Hidden, c.Intermediate, c.Seed = 256, 512, 33
	return c
}

// fileTensor is one tensor as the file stores it.
type fileTensor struct {
	name  string
	dtype string // safetensors dtype: F32, BF16, F16, F8_E4M3, I32
	shape []int
}

func (f fileTensor) bytes() int {
	n := stDTypeSize[f.dtype]
	for _, d := range f.shape {
		n *= d
	}
	return n
}

var stDTypeSize = map[string]int{"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "I32": 4}

// quantized reports whether the layout quantizes weight t: the decoder
// layers' projections, not routers, norms, embeddings or the head.
func (c Config) quantized(t tensorSpec) bool {
	if c.Quant == "" || len(t.shape) != 2 || !strings.Contains(t.name, "layers.") {
		return false
	}
	for _, s := range []string{"_proj.weight", ".w1.weight", ".w2.weight", ".w3.weight"} {
		if strings.HasSuffix(t.name, s) {
			return true
		}
	}
	return false
}

// fileTensors is how weight t is stored: itself in DType, or the
// layout's quantized tensors.
func (c Config) fileTensors(t tensorSpec) []fileTensor {
	if !c.quantized(t) {
		return []fileTensor{{t.name, dtypeNames[c.DType], t.shape}}
	}
	out, in := t.shape[0], t.shape[1]
	base := strings.TrimSuffix(t.name, ".weight")
	g := QuantGroup
	switch c.Quant {
	case QuantFP8Block:
		return []fileTensor{{t.name, "F8_E4M3", t.shape}, {base + ".weight_scale_inv", "F32", []int{ceilDiv(out, g), ceilDiv(in, g)}}}
	case QuantFP8Channel:
		return []fileTensor{{t.name, "F8_E4M3", t.shape}, {base + ".weight_scale", dtypeNames[c.DType], []int{out, 1}}}
	case QuantAWQ:
		return []fileTensor{{base + ".qweight", "I32", []int{in, out / 8}}, {base + ".qzeros", "I32", []int{in / g, out / 8}},
			{base + ".scales", "F16", []int{in / g, out}}}
	default: // QuantGPTQ
		return []fileTensor{{base + ".qweight", "I32", []int{in / 8, out}}, {base + ".qzeros", "I32", []int{in / g, out / 8}},
			{base + ".scales", "F16", []int{in / g, out}}, {base + ".g_idx", "I32", []int{in}}}
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// checkQuant checks the layout can store every quantized weight.
func (c Config) checkQuant(ts []tensorSpec) error {
	switch c.Quant {
	case "", QuantFP8Block, QuantFP8Channel:
		return nil
	case QuantAWQ, QuantGPTQ:
	default:
		return fmt.Errorf("%w: quant %q: want one of %v", ErrInvalidConfig, c.Quant, Quants())
	}
	for _, t := range ts {
		if c.quantized(t) && (t.shape[1]%QuantGroup != 0 || t.shape[0]%8 != 0) {
			return fmt.Errorf("%w: %s: %s [%d, %d] needs inputs a multiple of %d and outputs of 8 (TinyQuant has them)",
				ErrInvalidConfig, c.Quant, t.name, t.shape[0], t.shape[1], QuantGroup)
		}
	}
	return nil
}

// quantizationConfig is config.json's quantization_config for the layout.
func quantizationConfig(c Config) map[string]any {
	switch c.Quant {
	case QuantFP8Block:
		return map[string]any{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
			"weight_block_size": []int{QuantGroup, QuantGroup}}
	case QuantFP8Channel:
		ignore := []string{"lm_head"}
		if c.isMoE() { // the routers stay in DType, as RedHatAI's MoE checkpoints list them
			ignore = append(ignore, "re:.*mlp.gate$", "re:.*block_sparse_moe.gate$")
		}
		return map[string]any{
			"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
			"kv_cache_scheme": nil, "ignore": ignore,
			"config_groups": map[string]any{"group_0": map[string]any{
				"targets": []string{"Linear"},
				"weights": map[string]any{"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true,
					"dynamic": false, "group_size": nil, "block_structure": nil, "actorder": nil, "observer": "minmax"},
				"input_activations": map[string]any{"num_bits": 8, "type": "float", "strategy": "token", "symmetric": true,
					"dynamic": true, "group_size": nil, "block_structure": nil, "actorder": nil, "observer": nil},
				"output_activations": nil,
			}},
		}
	case QuantAWQ:
		return map[string]any{"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": QuantGroup,
			"zero_point": true, "modules_to_not_convert": nil}
	case QuantGPTQ:
		return map[string]any{"quant_method": "gptq", "bits": 4, "group_size": QuantGroup, "desc_act": false,
			"sym": true, "true_sequential": true, "damp_percent": 0.01, "static_groups": false,
			"checkpoint_format": "gptq", "model_name_or_path": nil, "model_file_base_name": nil}
	}
	return nil
}

// quantize returns the bytes of weight w ([out, in] row-major, values
// already rounded to DType) in the layout's tensors, in fileTensors'
// order.
func (c Config) quantize(t tensorSpec, w []float32) []byte {
	out, in := t.shape[0], t.shape[1]
	switch c.Quant {
	case QuantFP8Block:
		return fp8Block(w, out, in)
	case QuantFP8Channel:
		return fp8Channel(w, out, in, c.DType)
	case QuantAWQ:
		return awq(w, out, in)
	default:
		return gptq(w, out, in)
	}
}

func fp8Block(w []float32, out, in int) []byte {
	g := QuantGroup
	bo, bi := ceilDiv(out, g), ceilDiv(in, g)
	scales := make([]float32, bo*bi)
	for r := range out {
		for k := range in {
			s := &scales[(r/g)*bi+k/g]
			*s = max(*s, abs32(w[r*in+k]))
		}
	}
	for i, a := range scales {
		scales[i] = fp8Scale(a)
	}
	q := make([]byte, 0, out*in+4*len(scales))
	for r := range out {
		for k := range in {
			q = append(q, E4M3(w[r*in+k]/scales[(r/g)*bi+k/g]))
		}
	}
	for _, s := range scales {
		q = binary.LittleEndian.AppendUint32(q, math.Float32bits(s))
	}
	return q
}

func fp8Channel(w []float32, out, in int, dtype string) []byte {
	scales := make([]float32, out)
	for r := range out {
		a := float32(0)
		for _, v := range w[r*in : (r+1)*in] {
			a = max(a, abs32(v))
		}
		// The scale as stored (DType), so the weights are quantized by
		// the scale a reader multiplies with.
		scales[r] = roundTo(fp8Scale(a), dtype)
	}
	q := make([]byte, 0, out*in+out*dtypeSize(dtype))
	for r := range out {
		for _, v := range w[r*in : (r+1)*in] {
			q = append(q, E4M3(v/scales[r]))
		}
	}
	for _, s := range scales {
		q = appendValue(q, s, dtype)
	}
	return q
}

// fp8Scale is max|w| / 448 in float32 (as torch computes it), 1 for an
// all-zero block.
func fp8Scale(amax float32) float32 {
	if amax == 0 {
		return 1
	}
	return amax / 448
}

// int4Groups quantizes w [out, in] to 4 bits in groups of QuantGroup
// along the input: q [out][in], zero [out][in/g] and the float16 scale
// [out][in/g]. sym: scale 2 max|w| / 15 and zero 8 (GPTQ); else scale
// (max - min) / 15 and zero round(-min / scale) (AWQ).
func int4Groups(w []float32, out, in int, sym bool) (q, zero []uint8, scale []uint16) {
	g := QuantGroup
	ng := in / g
	q, zero, scale = make([]uint8, out*in), make([]uint8, out*ng), make([]uint16, out*ng)
	for r := range out {
		for j := range ng {
			grp := w[r*in+j*g : r*in+(j+1)*g]
			lo, hi := grp[0], grp[0]
			for _, v := range grp {
				lo, hi = min(lo, v), max(hi, v)
			}
			var s float64
			var z int
			if sym {
				s = 2 * math.Max(math.Abs(float64(lo)), math.Abs(float64(hi))) / 15
			} else {
				s = math.Max(float64(hi-lo), 1e-5) / 15
			}
			h := float16(float32(s))
			if h == 0 {
				h = float16(1)
			}
			s = float64(halfToFloat(h))
			if sym {
				z = 8
			} else {
				z = int(clamp(-math.RoundToEven(float64(lo)/s), 0, 15))
			}
			scale[r*ng+j], zero[r*ng+j] = h, uint8(z)
			for k, v := range grp {
				q[r*in+j*g+k] = uint8(clamp(math.RoundToEven(float64(v)/s)+float64(z), 0, 15))
			}
		}
	}
	return q, zero, scale
}

// awqOrder is AutoAWQ's pack order: nibble i of a word holds column
// 8c + awqOrder[i].
var awqOrder = [8]int{0, 2, 4, 6, 1, 3, 5, 7}

func awq(w []float32, out, in int) []byte {
	q, zero, scale := int4Groups(w, out, in, false)
	ng := in / QuantGroup
	b := make([]byte, 0, 4*in*out/8+4*ng*out/8+2*ng*out)
	pack := func(at func(n int) uint8, c int) uint32 {
		var word uint32
		for i, o := range awqOrder {
			word |= uint32(at(8*c+o)) << (4 * i)
		}
		return word
	}
	for k := range in {
		for c := range out / 8 {
			b = binary.LittleEndian.AppendUint32(b, pack(func(n int) uint8 { return q[n*in+k] }, c))
		}
	}
	for j := range ng {
		for c := range out / 8 {
			b = binary.LittleEndian.AppendUint32(b, pack(func(n int) uint8 { return zero[n*ng+j] }, c))
		}
	}
	for j := range ng {
		for n := range out {
			b = binary.LittleEndian.AppendUint16(b, scale[n*ng+j])
		}
	}
	return b
}

func gptq(w []float32, out, in int) []byte {
	q, zero, scale := int4Groups(w, out, in, true)
	ng := in / QuantGroup
	b := make([]byte, 0, 4*in*out/8+4*ng*out/8+2*ng*out+4*in)
	for r := range in / 8 {
		for n := range out {
			var word uint32
			for j := range 8 {
				word |= uint32(q[n*in+8*r+j]) << (4 * j)
			}
			b = binary.LittleEndian.AppendUint32(b, word)
		}
	}
	for j := range ng {
		for c := range out / 8 {
			var word uint32
			for i := range 8 {
				word |= uint32(zero[(8*c+i)*ng+j]-1) << (4 * i) // auto-gptq stores zero - 1
			}
			b = binary.LittleEndian.AppendUint32(b, word)
		}
	}
	for j := range ng {
		for n := range out {
			b = binary.LittleEndian.AppendUint16(b, scale[n*ng+j])
		}
	}
	for k := range in {
		b = binary.LittleEndian.AppendUint32(b, uint32(k/QuantGroup))
	}
	return b
}

func clamp(v, lo, hi float64) float64 { return math.Min(math.Max(v, lo), hi) }

func abs32(v float32) float32 { return float32(math.Abs(float64(v))) }

// E4M3 converts v to float8 e4m3fn (bias 7, no infinities, 0x7F NaN),
// rounding to nearest even and saturating to ±448, as the FP8
// checkpoints' quantizers clamp before converting.
func E4M3(v float32) byte {
	var sign byte
	if math.Signbit(float64(v)) {
		sign = 0x80
	}
	a := math.Abs(float64(v))
	switch {
	case math.IsNaN(a):
		return 0x7F
	case a >= 448:
		return sign | 0x7E
	}
	e := -6 // subnormals share the smallest normal exponent's quantum
	if a >= math.Ldexp(1, -6) {
		_, e2 := math.Frexp(a) // a = f * 2^e2, f in [0.5, 1)
		e = e2 - 1
	}
	n := int(math.RoundToEven(math.Ldexp(a, 3-e))) // a in units of the quantum 2^(e-3)
	if n == 16 {
		e, n = e+1, 8
	}
	if n < 8 { // subnormal (e is -6)
		return sign | byte(n)
	}
	return sign | byte(e+7)<<3 | byte(n-8)
}

// E4M3Value is the value of the float8 e4m3fn byte b.
func E4M3Value(b byte) float32 {
	exp, mant := int(b>>3&0xF), float64(b&7)
	var v float64
	switch {
	case b&0x7F == 0x7F:
		v = math.NaN()
	case exp == 0:
		v = math.Ldexp(mant/8, -6)
	default:
		v = math.Ldexp(1+mant/8, exp-7)
	}
	if b&0x80 != 0 {
		v = -v
	}
	return float32(v)
}

// roundTo rounds v to dtype's precision.
func roundTo(v float32, dtype string) float32 {
	switch dtype {
	case "bfloat16":
		return math.Float32frombits(uint32(bfloat16(v)) << 16)
	case "float16":
		return halfToFloat(float16(v))
	}
	return v
}

// halfToFloat is the value of IEEE half h.
func halfToFloat(h uint16) float32 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp, mant := int(h>>10&0x1F), float64(h&0x3FF)
	switch exp {
	case 0:
		return float32(sign * math.Ldexp(mant/1024, -14))
	case 31:
		if mant != 0 {
			return float32(math.NaN())
		}
		return float32(sign * math.Inf(1))
	}
	return float32(sign * math.Ldexp(1+mant/1024, exp-15))
}

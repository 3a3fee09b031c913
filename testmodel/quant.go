package testmodel

import (
	"fmt"
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
	// QuantGPTQActOrder is QuantGPTQ with desc_act true (act order,
	// static_groups false): GPTQ quantizes the inputs in an order of its
	// own (by the Hessian's diagonal; here a random permutation, shared
	// by the projections that read one input, q, k and v or gate and up,
	// as they share the Hessian) and group j holds the inputs at
	// positions [128j, 128j + 128) of that order. The tensors are
	// QuantGPTQ's, qweight in input order, and g_idx[k] is input k's
	// position in the order / 128: every group has 128 inputs, scattered.
	QuantGPTQActOrder = "gptq-actorder"
	// QuantGPTQv2 is GPTQModel's checkpoint_format "gptq_v2": QuantGPTQ's
	// tensors, except that qzeros hold the zero itself (8 for symmetric
	// 4-bit), not zero - 1; quantization_config as GPTQModel writes it
	// (checkpoint_format, pack_dtype "int32", meta.quantizer).
	QuantGPTQv2 = "gptq-v2"
	// QuantW4A16 is compressed-tensors "pack-quantized" as RedHatAI's
	// W4A16 checkpoints (llm-compressor's W4A16 scheme) have it: int 4-bit
	// weights, strategy "group" of 128 along the input, symmetric, no
	// activation quantization: weight_packed I32 [out, in/8] (nibble j of
	// word c holds input 8c + j as q + 8, q in [-8, 7]), weight_scale
	// [out, in/128] in DType (2 max|w| / 15), weight_shape I64 [2]
	// ([out, in]); w = q * s.
	QuantW4A16 = "w4a16"
	// QuantW4A16Asym is QuantW4A16 with symmetric false (W4A16_ASYM): scale
	// (max - min) / 15 and weight_zero_point I32 [out/8, in/128] packed
	// along the output (nibble i of row r holds output 8r + i's zero point
	// as zp + 8, zp in [-8, 7], as compressed-tensors packs them since
	// 0.10); w = (q - zp) * s.
	QuantW4A16Asym = "w4a16-asym"
	// QuantW4A16ActOrder is QuantW4A16 with actorder "group"
	// (llm-compressor's GPTQ with group act order): the groups are
	// QuantGPTQActOrder's, in the same order, and weight_g_idx I32 [in]
	// holds each input's group; weight_packed stays in input order.
	QuantW4A16ActOrder = "w4a16-actorder"
	// QuantMXFP4 is gpt_oss's published layout (quant_method "mxfp4"):
	// the experts' gate_up_proj and down_proj as _blocks U8 [E, out,
	// in/32, 16] (two FP4 E2M1 values a byte, the even one in the low
	// nibble) and _scales U8 [E, out, in/32] (a power of two per 32
	// inputs, exponent + 127); everything else, expert biases included,
	// in DType. For gpt_oss only; hidden and intermediate sizes a
	// multiple of 32.
	QuantMXFP4 = "mxfp4"
)

// QuantGroup is the group (and FP8 block) size of every quantized layout.
const QuantGroup = 128

// Quants lists the quantized layouts every engine here loads: FP8 block
// and channel, AWQ, GPTQ. AllQuants adds the others.
func Quants() []string { return []string{QuantFP8Block, QuantFP8Channel, QuantAWQ, QuantGPTQ} }

// AllQuants lists every quantized layout Write can produce: Quants and
// GPTQ with act order, GPTQ v2, compressed-tensors W4A16 symmetric,
// asymmetric and with act order (which the MLX engine loads and the
// torch engine refuses). QuantMXFP4, gpt_oss's alone, is not among them.
func AllQuants() []string {
	return append(Quants(), QuantGPTQActOrder, QuantGPTQv2, QuantW4A16, QuantW4A16Asym, QuantW4A16ActOrder)
}

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
	dtype string // safetensors dtype: F32, BF16, F16, F8_E4M3, I32, I64
	shape []int
}

func (f fileTensor) bytes() int {
	n := stDTypeSize[f.dtype]
	for _, d := range f.shape {
		n *= d
	}
	return n
}

var stDTypeSize = map[string]int{"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "I32": 4, "I64": 8, "U8": 1}

// quantized reports whether the layout quantizes weight t: the decoder
// layers' projections, not routers, norms, embeddings or the head.
func (c Config) quantized(t tensorSpec) bool {
	if c.Quant == QuantMXFP4 {
		return isMXFP4Expert(t)
	}
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

// int4 reports whether the layout stores 4-bit integers in groups of
// QuantGroup inputs.
func (c Config) int4() bool {
	switch c.Quant {
	case QuantAWQ, QuantGPTQ, QuantGPTQActOrder, QuantGPTQv2, QuantW4A16, QuantW4A16Asym, QuantW4A16ActOrder:
		return true
	}
	return false
}

// fileTensors is how weight t is stored: itself in DType, or the
// layout's quantized tensors.
func (c Config) fileTensors(t tensorSpec) []fileTensor {
	if !c.quantized(t) {
		return []fileTensor{{t.name, dtypeNames[c.DType], t.shape}}
	}
	if c.Quant == QuantMXFP4 { // [E, in, out] by blocks of 32 inputs
		e, in, out := t.shape[0], t.shape[1], t.shape[2]
		return []fileTensor{{t.name + "_blocks", "U8", []int{e, out, in / mxfp4Block, mxfp4Block / 2}},
			{t.name + "_scales", "U8", []int{e, out, in / mxfp4Block}}}
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
	case QuantW4A16, QuantW4A16Asym, QuantW4A16ActOrder:
		fts := []fileTensor{{base + ".weight_packed", "I32", []int{out, in / 8}},
			{base + ".weight_scale", dtypeNames[c.DType], []int{out, in / g}}, {base + ".weight_shape", "I64", []int{2}}}
		switch c.Quant {
		case QuantW4A16Asym:
			fts = append(fts, fileTensor{base + ".weight_zero_point", "I32", []int{out / 8, in / g}})
		case QuantW4A16ActOrder:
			fts = append(fts, fileTensor{base + ".weight_g_idx", "I32", []int{in}})
		}
		return fts
	default: // the GPTQ layouts
		return []fileTensor{{base + ".qweight", "I32", []int{in / 8, out}}, {base + ".qzeros", "I32", []int{in / g, out / 8}},
			{base + ".scales", "F16", []int{in / g, out}}, {base + ".g_idx", "I32", []int{in}}}
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// checkQuant checks the layout can store every quantized weight.
func (c Config) checkQuant(ts []tensorSpec) error {
	if err := c.checkGptOss(); err != nil {
		return err
	}
	switch {
	case c.Quant == "", c.Quant == QuantMXFP4, c.Quant == QuantFP8Block, c.Quant == QuantFP8Channel:
		return nil
	case !c.int4():
		return fmt.Errorf("%w: quant %q: want one of %v", ErrInvalidConfig, c.Quant, AllQuants())
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
	case QuantMXFP4: // as OpenAI publishes gpt-oss
		return map[string]any{"quant_method": "mxfp4", "modules_to_not_convert": []string{
			"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}}
	case QuantFP8Block:
		return map[string]any{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
			"weight_block_size": []int{QuantGroup, QuantGroup}}
	case QuantFP8Channel:
		return compressedTensors(c, "float-quantized",
			map[string]any{"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true,
				"dynamic": false, "group_size": nil, "block_structure": nil, "actorder": nil, "observer": "minmax"},
			map[string]any{"num_bits": 8, "type": "float", "strategy": "token", "symmetric": true,
				"dynamic": true, "group_size": nil, "block_structure": nil, "actorder": nil, "observer": nil})
	case QuantW4A16, QuantW4A16Asym, QuantW4A16ActOrder:
		var actorder any
		if c.Quant == QuantW4A16ActOrder {
			actorder = "group"
		}
		return compressedTensors(c, "pack-quantized",
			map[string]any{"num_bits": 4, "type": "int", "strategy": "group", "symmetric": c.Quant != QuantW4A16Asym,
				"dynamic": false, "group_size": QuantGroup, "block_structure": nil, "actorder": actorder, "observer": "minmax",
				"observer_kwargs": map[string]any{}},
			nil)
	case QuantAWQ:
		return map[string]any{"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": QuantGroup,
			"zero_point": true, "modules_to_not_convert": nil}
	case QuantGPTQ, QuantGPTQActOrder:
		return map[string]any{"quant_method": "gptq", "bits": 4, "group_size": QuantGroup, "desc_act": c.Quant == QuantGPTQActOrder,
			"sym": true, "true_sequential": true, "damp_percent": 0.01, "static_groups": false,
			"checkpoint_format": "gptq", "model_name_or_path": nil, "model_file_base_name": nil}
	case QuantGPTQv2:
		return map[string]any{"quant_method": "gptq", "bits": 4, "group_size": QuantGroup, "desc_act": false,
			"sym": true, "lm_head": false, "checkpoint_format": "gptq_v2", "pack_dtype": "int32",
			"meta": map[string]any{"quantizer": []string{"gptqmodel:2.2.0"}, "damp_percent": 0.01,
				"damp_auto_increment": 0.0025, "static_groups": false, "true_sequential": true, "mse": 0.0}}
	}
	return nil
}

// compressedTensors is a compressed-tensors quantization_config of one
// group targeting every Linear but lm_head (and MoE routers), weights
// and input_activations (nil: weight-only) as given.
func compressedTensors(c Config, format string, weights, inputs map[string]any) map[string]any {
	ignore := []string{"lm_head"}
	if c.isMoE() { // the routers stay in DType, as RedHatAI's MoE checkpoints list them
		ignore = append(ignore, "re:.*mlp.gate$", "re:.*block_sparse_moe.gate$")
	}
	var in any
	if inputs != nil {
		in = inputs
	}
	return map[string]any{
		"quant_method": "compressed-tensors", "format": format, "quantization_status": "compressed",
		"kv_cache_scheme": nil, "ignore": ignore,
		"config_groups": map[string]any{"group_0": map[string]any{
			"targets": []string{"Linear"}, "weights": weights, "input_activations": in, "output_activations": nil,
		}},
	}
}

// quantize returns the bytes of weight t ([out, in] row-major values w,
// already rounded to DType) in the layout's tensors, in fileTensors'
// order.
func (c Config) quantize(t tensorSpec, w []float32) []byte {
	if c.Quant == QuantMXFP4 {
		return mxfp4(w, t.shape)
	}
	out, in := t.shape[0], t.shape[1]
	switch c.Quant {
	case QuantFP8Block:
		return fp8Block(w, out, in)
	case QuantFP8Channel:
		return fp8Channel(w, out, in, c.DType)
	case QuantAWQ:
		return awq(w, out, in)
	case QuantW4A16, QuantW4A16Asym:
		return w4a16(w, out, in, c.Quant == QuantW4A16, nil, c.DType)
	case QuantW4A16ActOrder:
		return w4a16(w, out, in, true, c.actOrder(t), c.DType)
	case QuantGPTQActOrder:
		return gptq(w, out, in, c.actOrder(t), false)
	default:
		return gptq(w, out, in, nil, c.Quant == QuantGPTQv2)
	}
}

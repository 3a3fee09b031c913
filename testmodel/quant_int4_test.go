package testmodel

import (
	"encoding/binary"
	"math"
	"slices"
	"testing"
)

// rawTensor returns a tensor's bytes after checking its dtype and shape.
type rawTensor func(name, dtype string, shape ...int) []byte

// checkInt4 checks a 4-bit layout's quantization_config and the layout's
// own tensors of w ([256, 512]: model.layers.1.mlp.down_proj), and
// returns w dequantized as the layout defines it and the group of each
// input.
func checkInt4(t *testing.T, q string, qc map[string]any, raw rawTensor, w string) ([]float64, func(int) int) {
	t.Helper()
	group := func(k int) int { return k / 128 }
	switch q {
	case QuantAWQ:
		if qc["quant_method"] != "awq" || qc["bits"] != 4.0 || qc["group_size"] != 128.0 || qc["version"] != "gemm" {
			t.Fatalf("quantization_config %v", qc)
		}
		return dequantAWQ(raw, w), group
	case QuantW4A16, QuantW4A16Asym, QuantW4A16ActOrder:
		wts := qc["config_groups"].(map[string]any)["group_0"].(map[string]any)["weights"].(map[string]any)
		if qc["quant_method"] != "compressed-tensors" || qc["format"] != "pack-quantized" || wts["num_bits"] != 4.0 ||
			wts["type"] != "int" || wts["strategy"] != "group" || wts["group_size"] != 128.0 ||
			wts["symmetric"] != (q != QuantW4A16Asym) || (wts["actorder"] == "group") != (q == QuantW4A16ActOrder) {
			t.Fatalf("quantization_config %v", qc)
		}
		shape := raw(w+".weight_shape", "I64", 2)
		if binary.LittleEndian.Uint64(shape) != 256 || binary.LittleEndian.Uint64(shape[8:]) != 512 {
			t.Errorf("weight_shape %v, want [256 512]", shape)
		}
		var gi []int
		if q == QuantW4A16ActOrder {
			gi = checkActOrder(t, raw, w, ".weight_g_idx")
			group = func(k int) int { return gi[k] }
		}
		return dequantW4A16(raw, w, q != QuantW4A16Asym, gi), group
	}
	if qc["quant_method"] != "gptq" || qc["bits"] != 4.0 || qc["group_size"] != 128.0 || qc["desc_act"] != (q == QuantGPTQActOrder) ||
		(qc["checkpoint_format"] == "gptq_v2") != (q == QuantGPTQv2) {
		t.Fatalf("quantization_config %v", qc)
	}
	var gi []int
	if q == QuantGPTQActOrder {
		gi = checkActOrder(t, raw, w, ".g_idx")
		group = func(k int) int { return gi[k] }
	} else {
		gi = make([]int, 512)
		for k, g := range gidxOf(raw, w+".g_idx", 512) {
			if gi[k] = int(g); gi[k] != k/128 {
				t.Fatalf("g_idx[%d] = %d, want %d", k, g, k/128)
			}
		}
	}
	stored := uint32(0x77777777) // symmetric zero 8, stored as 8 - 1 (v1)
	if q == QuantGPTQv2 {
		stored = 0x88888888
	}
	if zs := raw(w+".qzeros", "I32", 4, 32); binary.LittleEndian.Uint32(zs) != stored {
		t.Errorf("symmetric zeros stored as %#x, want %#x", binary.LittleEndian.Uint32(zs), stored)
	}
	offset := 1.0
	if q == QuantGPTQv2 {
		offset = 0
	}
	return dequantGPTQ(raw, w, gi, offset), group
}

// checkActOrder checks the act order of w ([256, 512]) and of the
// projections of layer 0's attention, by their g_idx tensors (suffix):
// every group of w 128 inputs, not in input order, q, k and v in one
// order (they read one input), o in another. It returns w's g_idx.
func checkActOrder(t *testing.T, raw rawTensor, w, suffix string) []int {
	t.Helper()
	gi := make([]int, 512)
	counts := make([]int, 4)
	for k, g := range gidxOf(raw, w+suffix, 512) {
		gi[k] = int(g)
		counts[g]++
	}
	if slices.IsSorted(gi) || !slices.Equal(counts, []int{128, 128, 128, 128}) {
		t.Errorf("act order g_idx: sorted %v, group sizes %v; want scattered groups of 128", slices.IsSorted(gi), counts)
	}
	a := "model.layers.0.self_attn."
	if qo, ko, vo, oo := gidxOf(raw, a+"q_proj"+suffix, 256), gidxOf(raw, a+"k_proj"+suffix, 256), gidxOf(raw, a+"v_proj"+suffix, 256),
		gidxOf(raw, a+"o_proj"+suffix, 256); !slices.Equal(qo, ko) || !slices.Equal(qo, vo) || slices.Equal(qo, oo) {
		t.Error("q, k and v do not share an act order apart from o's")
	}
	return gi
}

func gidxOf(raw rawTensor, name string, in int) []uint32 {
	b := raw(name, "I32", in)
	out := make([]uint32, in)
	for k := range out {
		out[k] = binary.LittleEndian.Uint32(b[4*k:])
	}
	return out
}

func nibble(b []byte, word, i int) float64 {
	return float64(binary.LittleEndian.Uint32(b[4*word:]) >> (4 * i) & 15)
}

func dequantAWQ(raw rawTensor, w string) []float64 {
	qw := raw(w+".qweight", "I32", 512, 32)
	qz := raw(w+".qzeros", "I32", 4, 32)
	sc := raw(w+".scales", "F16", 4, 256)
	rev := [8]int{0, 4, 1, 5, 2, 6, 3, 7}
	out := make([]float64, 256*512)
	for n := range 256 {
		for k := range 512 {
			g := k / 128
			s := float64(halfToFloat(binary.LittleEndian.Uint16(sc[2*(g*256+n):])))
			out[n*512+k] = (nibble(qw, k*32+n/8, rev[n%8]) - nibble(qz, g*32+n/8, rev[n%8])) * s
		}
	}
	return out
}

// dequantGPTQ is w = (q - (stored zero + offset)) * scale, the zero and
// scale of input k's group g_idx[k].
func dequantGPTQ(raw rawTensor, w string, gidx []int, offset float64) []float64 {
	qw := raw(w+".qweight", "I32", 64, 256)
	qz := raw(w+".qzeros", "I32", 4, 32)
	sc := raw(w+".scales", "F16", 4, 256)
	out := make([]float64, 256*512)
	for n := range 256 {
		for k := range 512 {
			g := gidx[k]
			s := float64(halfToFloat(binary.LittleEndian.Uint16(sc[2*(g*256+n):])))
			out[n*512+k] = (nibble(qw, (k/8)*256+n, k%8) - (nibble(qz, g*32+n/8, n%8) + offset)) * s
		}
	}
	return out
}

// dequantW4A16 is w = ((packed - 8) - (zero point - 8)) * scale, the zero
// point 0 when symmetric, the scale of input k's group gidx[k] (nil:
// k / 128).
func dequantW4A16(raw rawTensor, w string, sym bool, gidx []int) []float64 {
	qw := raw(w+".weight_packed", "I32", 256, 64)
	sc := raw(w+".weight_scale", "F32", 256, 4)
	zp := func(n, g int) float64 { return 0 }
	if !sym {
		z := raw(w+".weight_zero_point", "I32", 32, 4)
		zp = func(n, g int) float64 { return nibble(z, (n/8)*4+g, n%8) - 8 }
	}
	out := make([]float64, 256*512)
	for n := range 256 {
		for k := range 512 {
			g := k / 128
			if gidx != nil {
				g = gidx[k]
			}
			s := float64(math.Float32frombits(binary.LittleEndian.Uint32(sc[4*(n*4+g):])))
			out[n*512+k] = (nibble(qw, n*64+k/8, k%8) - 8 - zp(n, g)) * s
		}
	}
	return out
}

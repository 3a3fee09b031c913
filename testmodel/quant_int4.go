package testmodel

import (
	"encoding/binary"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strings"
)

// int4Groups quantizes w [out, in] to 4 bits in groups of QuantGroup
// inputs: group j holds inputs order[j*g : (j+1)*g], or inputs j*g ..
// (j+1)*g - 1 when order is nil. It returns q [out][in] in [0, 15] in
// input order, zero [out][in/g] and scale [out][in/g], the scale rounded
// to scaleDType (as the file stores it, so the values are quantized by
// the scale a reader multiplies with). sym: scale 2 max|w| / 15 and zero
// 8 (GPTQ, compressed-tensors symmetric); else scale (max - min) / 15
// and zero round(-min / scale) (AWQ, compressed-tensors asymmetric).
func int4Groups(w []float32, out, in int, sym bool, order []int, scaleDType string) (q, zero []uint8, scale []float32) {
	g := QuantGroup
	ng := in / g
	if order == nil {
		order = make([]int, in)
		for k := range order {
			order[k] = k
		}
	}
	q, zero, scale = make([]uint8, out*in), make([]uint8, out*ng), make([]float32, out*ng)
	for r := range out {
		row := w[r*in : (r+1)*in]
		for j := range ng {
			members := order[j*g : (j+1)*g]
			lo, hi := row[members[0]], row[members[0]]
			for _, k := range members {
				lo, hi = min(lo, row[k]), max(hi, row[k])
			}
			var s float64
			if sym {
				s = 2 * math.Max(math.Abs(float64(lo)), math.Abs(float64(hi))) / 15
			} else {
				s = math.Max(float64(hi-lo), 1e-5) / 15
			}
			sr := roundTo(float32(s), scaleDType)
			if sr == 0 {
				sr = 1
			}
			s = float64(sr)
			z := 8
			if !sym {
				z = int(clamp(-math.RoundToEven(float64(lo)/s), 0, 15))
			}
			scale[r*ng+j], zero[r*ng+j] = sr, uint8(z)
			for _, k := range members {
				q[r*in+k] = uint8(clamp(math.RoundToEven(float64(row[k])/s)+float64(z), 0, 15))
			}
		}
	}
	return q, zero, scale
}

// actOrder is the order QuantGPTQActOrder quantizes weight t's inputs in:
// a permutation drawn from the seed and the input t reads, so the
// projections reading one input (q, k, v; gate, up) share it.
func (c Config) actOrder(t tensorSpec) []int {
	input := strings.NewReplacer("q_proj", "qkv", "k_proj", "qkv", "v_proj", "qkv",
		"gate_proj", "gate_up", "up_proj", "gate_up", ".w1.", ".w13.", ".w3.", ".w13.").Replace(t.name)
	h := fnv.New64a()
	h.Write([]byte(input))
	return rand.New(rand.NewPCG(uint64(c.Seed), h.Sum64())).Perm(t.shape[1])
}

// awqOrder is AutoAWQ's pack order: nibble i of a word holds column
// 8c + awqOrder[i].
var awqOrder = [8]int{0, 2, 4, 6, 1, 3, 5, 7}

func awq(w []float32, out, in int) []byte {
	q, zero, scale := int4Groups(w, out, in, false, nil, "float16")
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
	return appendScalesT(b, scale, out, ng, "float16")
}

// gptq writes qweight, qzeros, scales and g_idx. order is act order's
// (nil: groups in input order); v2 stores the zeros as GPTQModel's
// gptq_v2, else as auto-gptq's v1 (zero - 1).
func gptq(w []float32, out, in int, order []int, v2 bool) []byte {
	q, zero, scale := int4Groups(w, out, in, true, order, "float16")
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
	offset := uint8(1) // auto-gptq's v1 stores zero - 1
	if v2 {
		offset = 0
	}
	for j := range ng {
		for c := range out / 8 {
			var word uint32
			for i := range 8 {
				word |= uint32(zero[(8*c+i)*ng+j]-offset) << (4 * i)
			}
			b = binary.LittleEndian.AppendUint32(b, word)
		}
	}
	b = appendScalesT(b, scale, out, ng, "float16")
	return appendGIdx(b, order, in)
}

// appendGIdx appends g_idx: input k's group, its position in order (nil:
// in input order) / QuantGroup.
func appendGIdx(b []byte, order []int, in int) []byte {
	gidx := make([]uint32, in)
	for i := range gidx {
		k := i
		if order != nil {
			k = order[i]
		}
		gidx[k] = uint32(i / QuantGroup)
	}
	for _, g := range gidx {
		b = binary.LittleEndian.AppendUint32(b, g)
	}
	return b
}

// appendScalesT appends scale [out][ng] transposed, [ng][out], as AWQ
// and GPTQ store it.
func appendScalesT(b []byte, scale []float32, out, ng int, dtype string) []byte {
	for j := range ng {
		for n := range out {
			b = appendValue(b, scale[n*ng+j], dtype)
		}
	}
	return b
}

// w4a16 writes compressed-tensors' weight_packed, weight_scale,
// weight_shape and, when asymmetric, weight_zero_point or, with an act
// order, weight_g_idx. Its signed values q - 8 and zero points zero - 8
// are stored with compressed-tensors' offset of 8: the unsigned q and
// zero int4Groups makes.
func w4a16(w []float32, out, in int, sym bool, order []int, dtype string) []byte {
	q, zero, scale := int4Groups(w, out, in, sym, order, dtype)
	ng := in / QuantGroup
	b := make([]byte, 0, 4*out*in/8+dtypeSize(dtype)*out*ng+16+4*out/8*ng)
	for n := range out {
		for c := range in / 8 {
			var word uint32
			for j := range 8 {
				word |= uint32(q[n*in+8*c+j]) << (4 * j)
			}
			b = binary.LittleEndian.AppendUint32(b, word)
		}
	}
	for _, s := range scale {
		b = appendValue(b, s, dtype)
	}
	b = binary.LittleEndian.AppendUint64(b, uint64(out))
	b = binary.LittleEndian.AppendUint64(b, uint64(in))
	if order != nil {
		return appendGIdx(b, order, in)
	}
	if sym {
		return b
	}
	for r := range out / 8 {
		for j := range ng {
			var word uint32
			for i := range 8 {
				word |= uint32(zero[(8*r+i)*ng+j]) << (4 * i)
			}
			b = binary.LittleEndian.AppendUint32(b, word)
		}
	}
	return b
}

func clamp(v, lo, hi float64) float64 { return math.Min(math.Max(v, lo), hi) }

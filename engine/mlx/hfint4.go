package mlx

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/mlxserving/mlxserving/engine"
)

// int4Names are the tensors of a 4-bit module, by their names after the
// module's ("model.layers.0.mlp.down_proj."): the packed values, zero
// points, scales, each input's group and (compressed-tensors) the
// weight's shape.
type int4Names struct{ packed, zeros, scales, gidx, shape string }

func (q *hfQuant) names() int4Names {
	if q.Method == "pack-quantized" {
		return int4Names{"weight_packed", "weight_zero_point", "weight_scale", "weight_g_idx", "weight_shape"}
	}
	return int4Names{"qweight", "qzeros", "scales", "g_idx", ""}
}

// hasZeros reports whether the layout stores zero points.
func (q *hfQuant) hasZeros() bool { return q.Method != "pack-quantized" || q.Asym }

// convertInt4 replaces the manifest entries (in out) of the 4-bit module
// under base (its name and a dot) with the MLX affine tensors the engine
// loads: weight, scales and biases, and perm where the module has a
// g_idx (an empty tensor when its groups are in input order). make_ gets
// how to make them: one requant4 on first use.
func convertInt4(q *hfQuant, man, out map[string]tensorInfo, make_ map[string]func() (hfTensor, error), base, dtype string) error {
	n := q.names()
	rows, in, err := int4Shape(q, man, base)
	if err != nil {
		return err
	}
	file := man[base+n.packed].File
	for _, s := range []string{n.packed, n.zeros, n.scales, n.gidx, n.shape} {
		if s != "" {
			delete(out, base+s)
		}
	}
	ng := in / q.Group
	out[base+"weight"] = tensorInfo{File: file, DType: "U32", Shape: []int{rows, in / 8}}
	out[base+"scales"] = tensorInfo{File: file, DType: dtype, Shape: []int{rows, ng}}
	out[base+"biases"] = tensorInfo{File: file, DType: dtype, Shape: []int{rows, ng}}
	made := []string{"weight", "scales", "biases"}
	if _, ok := man[base+n.gidx]; ok {
		out[base+"perm"] = tensorInfo{File: file, DType: "U32", Shape: []int{in}}
		made = append(made, "perm")
	}
	var conv *[4]hfTensor
	for i, s := range made {
		make_[base+s] = func() (hfTensor, error) {
			if conv == nil {
				c, err := requant4(q, man, base, rows, in)
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
	return nil
}

// int4Shape checks the dtypes and shapes of a 4-bit module's tensors and
// returns its output and input sizes.
func int4Shape(q *hfQuant, man map[string]tensorInfo, base string) (out, in int, err error) {
	n := q.names()
	qw, qz, sc := man[base+n.packed], man[base+n.zeros], man[base+n.scales]
	bad := func(tensor, reason string) error {
		return &engine.CheckpointError{Path: qw.File, Tensor: base + tensor, Reason: reason}
	}
	need := []string{n.packed, n.scales}
	if q.hasZeros() {
		need = append(need, n.zeros)
	}
	for _, s := range need {
		if t, ok := man[base+s]; !ok {
			return 0, 0, bad(s, "missing")
		} else if len(t.Shape) != 2 {
			return 0, 0, bad(s, fmt.Sprintf("shape %v: want 2-D", t.Shape))
		}
	}
	var wantW, wantZ []int
	switch q.Method {
	case "pack-quantized": // [out, in/8], zero points packed along the output
		out, in = sc.Shape[0], sc.Shape[1]*q.Group
		wantW, wantZ = []int{out, in / 8}, []int{(out + 7) / 8, in / q.Group}
	case "awq": // [in, out/8]
		out, in = sc.Shape[1], sc.Shape[0]*q.Group
		wantW, wantZ = []int{in, out / 8}, []int{in / q.Group, out / 8}
	default: // GPTQ: [in/8, out]
		out, in = sc.Shape[1], sc.Shape[0]*q.Group
		wantW, wantZ = []int{in / 8, out}, []int{in / q.Group, out / 8}
	}
	switch {
	case (q.Method != "pack-quantized" && out%8 != 0) || !slices.Equal(qw.Shape, wantW) || qw.DType != "I32":
		return 0, 0, bad(n.packed, fmt.Sprintf("%s %v does not fit %s %v (want I32 %v)", qw.DType, qw.Shape, n.scales, sc.Shape, wantW))
	case q.hasZeros() && (!slices.Equal(qz.Shape, wantZ) || qz.DType != "I32"):
		return 0, 0, bad(n.zeros, fmt.Sprintf("%s %v: want I32 %v (packed 4-bit)", qz.DType, qz.Shape, wantZ))
	case sc.DType != "F16" && sc.DType != "BF16" && sc.DType != "F32":
		return 0, 0, bad(n.scales, "dtype "+sc.DType+": want F16, BF16 or F32")
	}
	if g, ok := man[base+n.gidx]; ok && (!slices.Equal(g.Shape, []int{in}) || g.DType != "I32") {
		return 0, 0, bad(n.gidx, fmt.Sprintf("%s %v: want I32 [%d]", g.DType, g.Shape, in))
	}
	if s, ok := man[base+n.shape]; n.shape != "" && ok && (!slices.Equal(s.Shape, []int{2}) || (s.DType != "I64" && s.DType != "I32")) {
		return 0, 0, bad(n.shape, fmt.Sprintf("%s %v: want I64 [2]", s.DType, s.Shape))
	}
	return out, in, nil
}

// requant4 makes the MLX affine tensors of a 4-bit module: packed weight
// [out, in/8], scales and biases [out, in/g] and, when the module's g_idx
// scatters its groups, the input order [in] (actOrder); the weight's
// inputs are in that order.
func requant4(q *hfQuant, man map[string]tensorInfo, base string, out, in int) ([4]hfTensor, error) {
	var r [4]hfTensor
	n := q.names()
	qw, err := readU32(man, base+n.packed)
	if err != nil {
		return r, err
	}
	sc, err := readFloats(man, base+n.scales)
	if err != nil {
		return r, err
	}
	var qz, gidx []uint32
	if q.hasZeros() {
		if qz, err = readU32(man, base+n.zeros); err != nil {
			return r, err
		}
	}
	if _, ok := man[base+n.gidx]; ok {
		if gidx, err = readU32(man, base+n.gidx); err != nil {
			return r, err
		}
	}
	if err := checkWeightShape(man, base+n.shape, out, in); err != nil {
		return r, err
	}
	ng := in / q.Group
	order, reason := actOrder(gidx, q.Group, ng)
	if reason != "" {
		return r, &engine.CheckpointError{Path: man[base+n.gidx].File, Tensor: base + n.gidx, Reason: reason}
	}
	val, zero, scale := q.int4Values(qw, qz, sc, out, in)
	packed := make([]uint32, out*in/8)
	scales, biases := make([]float32, out*ng), make([]float32, out*ng)
	for o := range out {
		for i := range in {
			k := i
			if order != nil {
				k = int(order[i])
			}
			packed[o*(in/8)+i/8] |= val(k, o) << (4 * (i % 8)) // MLX: element j of a word in bits 4j
		}
		for g := range ng {
			s := scale(g, o)
			if !(s >= 0) || math.IsInf(float64(s), 0) {
				return r, &engine.CheckpointError{Path: man[base+n.scales].File, Tensor: base + n.scales, Reason: "scale holds NaN, infinite or negative values"}
			}
			scales[o*ng+g], biases[o*ng+g] = s, -s*zero(g, o)
		}
	}
	r[0] = hfTensor{Shape: []int{out, in / 8}, U32: packed}
	r[1] = hfTensor{Shape: []int{out, ng}, F32: scales}
	r[2] = hfTensor{Shape: []int{out, ng}, F32: biases}
	if order != nil {
		r[3] = hfTensor{Shape: []int{in}, U32: order}
	}
	return r, nil
}

// int4Values reads a layout's tensors: the unsigned 4-bit value of weight
// (output o, input k), and the zero (unsigned, as the values) and scale of
// group g of output o.
func (q *hfQuant) int4Values(qw, qz []uint32, sc []float32, out, in int) (val func(k, o int) uint32, zero func(g, o int) float32, scale func(g, o int) float32) {
	ng := in / q.Group
	awqNibble := [8]int{0, 4, 1, 5, 2, 6, 3, 7} // AWQ: column j of a word is nibble awqNibble[j]
	switch q.Method {
	case "awq":
		val = func(k, o int) uint32 { return qw[k*(out/8)+o/8] >> (4 * awqNibble[o%8]) & 15 }
		zero = func(g, o int) float32 { return float32(qz[g*(out/8)+o/8] >> (4 * awqNibble[o%8]) & 15) }
	case "gptq":
		val = func(k, o int) uint32 { return qw[(k/8)*out+o] >> (4 * (k % 8)) & 15 }
		zero = func(g, o int) float32 { return float32(qz[g*(out/8)+o/8]>>(4*(o%8))&15 + q.ZeroOffset) }
	default: // pack-quantized: value and zero point stored plus 8
		val = func(k, o int) uint32 { return qw[o*(in/8)+k/8] >> (4 * (k % 8)) & 15 }
		zero = func(int, int) float32 { return 8 }
		if q.Asym {
			zero = func(g, o int) float32 { return float32(qz[(o/8)*ng+g] >> (4 * (o % 8)) & 15) }
		}
		return val, zero, func(g, o int) float32 { return sc[o*ng+g] }
	}
	return val, zero, func(g, o int) float32 { return sc[g*out+o] }
}

// checkWeightShape checks compressed-tensors' weight_shape, when the
// module has one, against the [out, in] its other tensors give.
func checkWeightShape(man map[string]tensorInfo, name string, out, in int) error {
	t, ok := man[name]
	if !ok {
		return nil
	}
	b, err := readRaw(man, name)
	if err != nil {
		return err
	}
	var got [2]int64
	for i := range got {
		if t.DType == "I64" {
			got[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
		} else {
			got[i] = int64(int32(binary.LittleEndian.Uint32(b[4*i:])))
		}
	}
	if got != [2]int64{int64(out), int64(in)} {
		return &engine.CheckpointError{Path: t.File, Tensor: name, Reason: fmt.Sprintf("%v: want [%d %d] (the input a multiple of group_size)", got, out, in)}
	}
	return nil
}

// actOrder returns the input order that makes the groups of g_idx (each
// input's group; nil: input k in group k / group) contiguous, as MLX's
// groups are: the inputs sorted by group, stably. It returns nil when
// they already are, and the reason when g_idx names a group past the
// last or puts other than group inputs in a group (which no layout of
// contiguous groups holds).
//
// GPTQ's act order (desc_act) quantizes the inputs in an order of its own
// and stores each input's group in g_idx, the weight in input order. The
// engine serves it exactly: the weight's inputs, requantized in this
// order, hold the same 4-bit values, scales and zeros, and the module
// reads its input gathered in this order (linear.perm), so y = W' x[perm]
// = W x. The gather costs one pass over the module's input; projections
// that read one input with one order (q, k, v; gate, up, as GPTQ gives
// them) stay fused and gather once.
func actOrder(gidx []uint32, group, ng int) ([]uint32, string) {
	if gidx == nil {
		return nil, ""
	}
	counts := make([]int, ng)
	inOrder := true
	for k, g := range gidx {
		if int64(g) >= int64(ng) {
			return nil, fmt.Sprintf("g_idx[%d] = %d: want a group below %d", k, int32(g), ng)
		}
		counts[g]++
		inOrder = inOrder && int(g) == k/group
	}
	if inOrder {
		return nil, ""
	}
	for g, c := range counts {
		if c != group {
			return nil, fmt.Sprintf("g_idx puts %d inputs in group %d: want %d (MLX groups are group_size inputs)", c, g, group)
		}
	}
	next := make([]int, ng)
	for g := range next {
		next[g] = g * group
	}
	order := make([]uint32, len(gidx))
	for k, g := range gidx {
		order[next[g]] = uint32(k)
		next[g]++
	}
	return order, ""
}

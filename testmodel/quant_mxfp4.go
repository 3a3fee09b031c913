package testmodel

import "math"

// mxfp4Block is the number of values sharing one MXFP4 scale.
const mxfp4Block = 32

// fp4Values are the FP4 (E2M1) magnitudes of codes 0 to 7; bit 3 is the
// sign.
var fp4Values = [8]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}

// mxfp4 stores a gpt_oss expert tensor w ([E, in, out] row-major: the
// matrix each expert's rows are multiplied by) as OCP MX FP4 along its
// input: per expert and output, blocks of 32 inputs share a power-of-two
// scale 2^(floor(log2 max|w|) - 2) (the largest FP4 exponent is 2),
// stored as the byte exponent + 127 (E8M0); each value is w / scale
// rounded to the nearest FP4 value (ties to the even code), saturating
// at ±6. Value 2j of a block is the low nibble of byte j, 2j + 1 the
// high one. The bytes are the _blocks tensor, U8 [E, out, in/32, 16],
// then the _scales tensor, U8 [E, out, in/32].
func mxfp4(w []float32, shape []int) []byte {
	e, in, out := shape[0], shape[1], shape[2]
	g := in / mxfp4Block
	blocks := make([]byte, 0, e*out*in/2)
	scales := make([]byte, 0, e*out*g)
	for x := range e {
		for o := range out {
			at := func(k int) float64 { return float64(w[(x*in+k)*out+o]) }
			for b := range g {
				amax := 0.0
				for k := b * mxfp4Block; k < (b+1)*mxfp4Block; k++ {
					amax = math.Max(amax, math.Abs(at(k)))
				}
				exp := 0
				if amax > 0 {
					exp = min(max(int(math.Floor(math.Log2(amax)))-2, -127), 127)
				}
				scales = append(scales, byte(exp+127))
				scale := math.Ldexp(1, exp)
				for k := b * mxfp4Block; k < (b+1)*mxfp4Block; k += 2 {
					blocks = append(blocks, fp4(at(k)/scale)|fp4(at(k+1)/scale)<<4)
				}
			}
		}
	}
	return append(blocks, scales...)
}

// fp4 is the E2M1 code nearest v (ties to the even code), saturating.
func fp4(v float64) byte {
	a, best := math.Abs(v), 0
	for i, f := range fp4Values {
		d, bd := math.Abs(a-f), math.Abs(a-fp4Values[best])
		if d < bd || (d == bd && i%2 == 0 && best%2 == 1) {
			best = i
		}
	}
	code := byte(best)
	if math.Signbit(v) && best != 0 {
		code |= 8
	}
	return code
}

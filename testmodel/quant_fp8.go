package testmodel

import (
	"encoding/binary"
	"math"
)

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

package testmodel

import (
	"encoding/binary"
	"math"
	"path/filepath"
	"testing"
)

// TestFP4 checks the E2M1 rounding: nearest value, ties to the even
// code, saturation at 6, the sign in bit 3.
func TestFP4(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want byte
	}{{0, 0}, {0.2, 0}, {0.25, 0}, {0.3, 1}, {0.75, 2}, {1.25, 2}, {2.5, 4}, {3.5, 6}, {5, 6}, {5.1, 7}, {100, 7}, {-1, 10}, {-7.9, 15}} {
		if got := fp4(c.v); got != c.want {
			t.Errorf("fp4(%v) = %d, want %d", c.v, got, c.want)
		}
	}
}

// TestMXFP4Layout writes gpt_oss in the MXFP4 layout and decodes its
// experts back: shapes as published, every value within the format's
// error of the float checkpoint's (half a step of its block's scale, or
// the saturation at 6 scales).
func TestMXFP4Layout(t *testing.T) {
	c := TinyFamily("gpt_oss")
	fdir, qdir := t.TempDir(), t.TempDir()
	if err := Write(fdir, c); err != nil {
		t.Fatal(err)
	}
	c.Quant = QuantMXFP4
	if err := Write(qdir, c); err != nil {
		t.Fatal(err)
	}
	fh, fraw := readSafetensors(t, filepath.Join(fdir, "model.safetensors"))
	qh, qraw := readSafetensors(t, filepath.Join(qdir, "model.safetensors"))
	name := "model.layers.2.mlp.experts.gate_up_proj"
	if _, ok := qh[name]; ok {
		t.Fatalf("%s stored as float", name)
	}
	blocks, scales := qh[name+"_blocks"], qh[name+"_scales"]
	e, h, two := 4, c.Hidden, 2*c.Intermediate // Experts 0 writes 4
	if !equalInts(blocks.Shape, []int{e, two, h / 32, 16}) || !equalInts(scales.Shape, []int{e, two, h / 32}) ||
		blocks.DType != "U8" || scales.DType != "U8" {
		t.Fatalf("blocks %v %v, scales %v %v", blocks.DType, blocks.Shape, scales.DType, scales.Shape)
	}
	w := floats32(fraw[fh[name].Offsets[0]:fh[name].Offsets[1]])
	b := qraw[blocks.Offsets[0]:blocks.Offsets[1]]
	s := qraw[scales.Offsets[0]:scales.Offsets[1]]
	for x := range e {
		for o := range two {
			for k := range h {
				row := (x*two+o)*(h/32) + k/32
				nib := b[row*16+(k%32)/2] >> (4 * (k % 2)) & 15
				v := fp4Values[nib&7] * math.Ldexp(1, int(s[row])-127)
				if nib&8 != 0 {
					v = -v
				}
				want := float64(w[(x*h+k)*two+o])
				if d := math.Abs(v - want); d > math.Ldexp(1, int(s[row])-127)*2 {
					t.Fatalf("expert %d output %d input %d: %v, float %v", x, o, k, v, want)
				}
			}
		}
	}
}

// floats32 reads little-endian float32 values.
func floats32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

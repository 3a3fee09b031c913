package testmodel

import (
	"encoding/binary"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

// TestE4M3 checks the conversion on every finite code (each value
// converts to itself), at the midpoints between neighbours (ties go to the
// even code), and at the edges: saturation at ±448, NaN, signed zero.
func TestE4M3(t *testing.T) {
	for b := 0; b < 256; b++ {
		if b&0x7F == 0x7F {
			if !math.IsNaN(float64(E4M3Value(byte(b)))) {
				t.Errorf("code %#x: want NaN", b)
			}
			continue
		}
		v := E4M3Value(byte(b))
		if got := E4M3(v); got != byte(b) && !(v == 0 && got&0x7F == 0) {
			t.Errorf("E4M3(%v) = %#x, want %#x", v, got, b)
		}
		if b&0x7F == 0x7E || b&0x80 != 0 {
			continue
		}
		next := E4M3Value(byte(b + 1))
		mid := (v + next) / 2
		want := byte(b)
		if b&1 == 1 {
			want = byte(b + 1)
		}
		if got := E4M3(mid); got != want {
			t.Errorf("E4M3(%v), the midpoint of %#x and %#x: %#x, want %#x", mid, b, b+1, got, want)
		}
		if got := E4M3(math.Nextafter32(mid, 0)); got != byte(b) {
			t.Errorf("below the midpoint of %#x: %#x", b, got)
		}
	}
	for v, want := range map[float32]byte{448: 0x7E, 1e9: 0x7E, -500: 0xFE, 464: 0x7E, 0.0019531250: 0x01, 0.0009: 0x00} {
		if got := E4M3(v); got != want {
			t.Errorf("E4M3(%v) = %#x, want %#x", v, got, want)
		}
	}
	if E4M3(float32(math.NaN()))&0x7F != 0x7F {
		t.Error("NaN does not convert to NaN")
	}
	if E4M3(float32(math.Copysign(0, -1))) != 0x80 {
		t.Error("-0 loses its sign")
	}
}

// TestQuantLayouts writes TinyQuant in every layout and checks the tensor
// names, dtypes and shapes against the published layouts, the
// quantization_config, that the unquantized tensors are the float
// model's bytes, and that each dequantized weight is within the format's
// rounding error of the float model's (relative to the largest magnitude
// of its group, which act order scatters over the row).
func TestQuantLayouts(t *testing.T) {
	cfg := TinyQuant()
	fdir := t.TempDir()
	if err := Write(fdir, cfg); err != nil {
		t.Fatal(err)
	}
	fhdr, fdata := readSafetensors(t, filepath.Join(fdir, "model.safetensors"))
	floatOf := func(name string) []float32 {
		e := fhdr[name]
		raw := fdata[e.Offsets[0]:e.Offsets[1]]
		out := make([]float32, len(raw)/4)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		return out
	}
	const w = "model.layers.1.mlp.down_proj" // [256, 512]
	for _, q := range AllQuants() {
		t.Run(q, func(t *testing.T) {
			c := cfg
			c.Quant = q
			dir := t.TempDir()
			if err := Write(dir, c); err != nil {
				t.Fatal(err)
			}
			hdr, data := readSafetensors(t, filepath.Join(dir, "model.safetensors"))
			var conf map[string]any
			readJSON(t, filepath.Join(dir, "config.json"), &conf)
			qc, _ := conf["quantization_config"].(map[string]any)
			raw := func(name, dtype string, shape ...int) []byte {
				t.Helper()
				e, ok := hdr[name]
				if !ok {
					t.Fatalf("no tensor %s", name)
				}
				if e.DType != dtype || !equalInts(e.Shape, shape) {
					t.Fatalf("%s: %s %v, want %s %v", name, e.DType, e.Shape, dtype, shape)
				}
				return data[e.Offsets[0]:e.Offsets[1]]
			}
			for name, e := range fhdr {
				_, kept := hdr[name]
				proj := strings.Contains(name, "_proj.")
				if kept == (proj && c.int4()) {
					t.Errorf("%s: in the file %v", name, kept)
				}
				if !proj && string(data[hdr[name].Offsets[0]:hdr[name].Offsets[1]]) != string(fdata[e.Offsets[0]:e.Offsets[1]]) {
					t.Errorf("%s differs from the float model's", name)
				}
			}
			want := floatOf(w + ".weight")
			got := make([]float64, len(want))
			tol := 0.0                                  // the largest error the format allows, relative to each group's range
			group := func(k int) int { return k / 128 } // the group (block) of input k
			switch q {
			case QuantFP8Block:
				if qc["quant_method"] != "fp8" || qc["fmt"] != "e4m3" || qc["activation_scheme"] != "dynamic" {
					t.Fatalf("quantization_config %v", qc)
				}
				wq := raw(w+".weight", "F8_E4M3", 256, 512)
				s := raw(w+".weight_scale_inv", "F32", 2, 4)
				for i := range got {
					r, k := i/512, i%512
					got[i] = float64(E4M3Value(wq[i])) * float64(math.Float32frombits(binary.LittleEndian.Uint32(s[4*((r/128)*4+k/128):])))
				}
				tol = 1.0 / 16 // 3 mantissa bits: half a step is 1/16 of the value
			case QuantFP8Channel:
				groups := qc["config_groups"].(map[string]any)["group_0"].(map[string]any)
				if qc["quant_method"] != "compressed-tensors" || qc["format"] != "float-quantized" ||
					groups["weights"].(map[string]any)["strategy"] != "channel" ||
					groups["input_activations"].(map[string]any)["dynamic"] != true {
					t.Fatalf("quantization_config %v", qc)
				}
				wq := raw(w+".weight", "F8_E4M3", 256, 512)
				s := raw(w+".weight_scale", "F32", 256, 1)
				for i := range got {
					got[i] = float64(E4M3Value(wq[i])) * float64(math.Float32frombits(binary.LittleEndian.Uint32(s[4*(i/512):])))
				}
				tol = 1.0 / 16
			default:
				got, group = checkInt4(t, q, qc, raw, w)
				// AWQ, asymmetric: half a step of (max - min) / 15.
				// Symmetric: +max|w| is 7.5 steps of 2 max|w| / 15,
				// clamped to 7: 1/15 of it, plus the half-precision
				// scale's rounding.
				tol = 0.07
			}
			var worst float64
			for i := range got {
				r, k := i/512, i%512
				var amax float64
				for j, v := range want[r*512 : (r+1)*512] {
					if group(j) == group(k) {
						amax = math.Max(amax, math.Abs(float64(v)))
					}
				}
				if q == QuantFP8Block || q == QuantFP8Channel {
					amax = math.Abs(float64(want[i])) + 1e-3*amax // relative, with a floor at subnormals
				}
				worst = math.Max(worst, math.Abs(got[i]-float64(want[i]))/amax)
			}
			if worst > tol || worst == 0 {
				t.Errorf("dequantized %s: worst error %.4f of the scale, want within %.4f and not exact", w, worst, tol)
			}
		})
	}
}

// TestQuantInvalid: a 4-bit layout on widths that are not multiples of
// 128, and an unknown layout, are ErrInvalidConfig.
func TestQuantInvalid(t *testing.T) {
	for _, q := range append(AllQuants(), "int3") {
		c := Config{Quant: q}
		if q == QuantFP8Block || q == QuantFP8Channel {
			continue
		}
		if err := Write(t.TempDir(), c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%q on Tiny: %v, want ErrInvalidConfig", c.Quant, err)
		}
	}
	c := Tiny()
	c.Quant = QuantFP8Block // blocks at the edge are partial: any width works
	if err := Write(t.TempDir(), c); err != nil {
		t.Fatal(err)
	}
}

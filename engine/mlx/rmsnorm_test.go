//go:build mlx

package mlx

import (
	"math"
	"testing"
)

// TestRMSNormMixesRows pins the band of row lengths where MLX 0.31's CUDA
// rms_norm reduces two rows together: (128, 256] in float32, (256, 512]
// in bfloat16 and float16.
func TestRMSNormMixesRows(t *testing.T) {
	for _, c := range []struct {
		n, size int
		want    bool
	}{
		{128, 4, false}, {129, 4, true}, {256, 4, true}, {257, 4, false}, {1152, 4, false},
		{256, 2, false}, {257, 2, true}, {512, 2, true}, {513, 2, false}, {256, 8, false},
	} {
		if got := rmsNormMixesRows(c.n, c.size); got != c.want {
			t.Errorf("rmsNormMixesRows(%d, %d) = %v, want %v", c.n, c.size, got, c.want)
		}
	}
}

// TestRMSNormRows checks the engine's RMS norm (rmsNorm, and rmsNormOps
// that stands in for MLX's fast rms_norm in the band above on CUDA)
// against float64, at row lengths in and around the band, an odd number
// of rows. On a CUDA GPU it also logs how far MLX's fast rms_norm is off.
func TestRMSNormRows(t *testing.T) {
	m := load(t, newEngine(t), tinyDir(t, nil))
	const rows, eps = 5, 1e-6
	for _, n := range []int{64, 200, 256, 320} {
		x, w := make([]float32, rows*n), make([]float32, n)
		for i := range x {
			x[i] = float32(math.Sin(float64(i)*0.37)) * float32(1+i/n) // rows of different scales
		}
		for i := range w {
			w[i] = 1 + float32(math.Cos(float64(i)*0.11))/4
		}
		want := make([]float64, rows*n)
		for r := range rows {
			var ss float64
			for _, v := range x[r*n : (r+1)*n] {
				ss += float64(v) * float64(v)
			}
			inv := 1 / math.Sqrt(ss/float64(n)+eps)
			for j := range n {
				want[r*n+j] = float64(x[r*n+j]) * inv * float64(w[j])
			}
		}
		var got [3][]float32
		err := m.call(func(g *graph) error {
			xa, wa := g.float32s(x, rows, n), g.float32s(w, n)
			outs := []arr{g.rmsNorm(xa, wa, eps), g.rmsNormOps(xa, wa, eps), g.fastRMSNorm(xa, wa, eps)}
			g.eval(outs...)
			for i, o := range outs {
				if g.err != nil {
					return g.err
				}
				v, err := readFloat32s(o)
				if err != nil {
					return err
				}
				got[i] = v
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		worst := [3]float64{}
		for i, v := range got {
			for j := range v {
				worst[i] = math.Max(worst[i], math.Abs(float64(v[j])-want[j]))
			}
		}
		if worst[0] > 1e-5 || worst[1] > 1e-5 {
			t.Errorf("rows of %d: rmsNorm off by %.3g, rmsNormOps by %.3g", n, worst[0], worst[1])
		}
		if worst[2] > 1e-5 {
			t.Logf("rows of %d: MLX's fast rms_norm off by %.3g (rmsNormMixesRows(%d, 4) = %v)", n, worst[2], n, rmsNormMixesRows(n, 4))
		}
	}
}

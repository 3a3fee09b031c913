package mlx

import "math"

// ropeFreqs returns the RoPE frequencies for llama3 and yarn scaling (as
// MLX's fast.rope takes them: base**(2i/d), scaled), or nil for plain
// RoPE.
func ropeFreqs(c *modelConfig) []float32 {
	switch c.Rope.Type {
	case "llama3":
		return llama3Freqs(c)
	case "yarn":
		return yarnFreqs(c)
	}
	return nil
}

func llama3Freqs(c *modelConfig) []float32 {
	s, d := c.Rope, c.HeadDim
	low := float64(s.OriginalMax) / s.LowFreqFactor
	high := float64(s.OriginalMax) / s.HighFreqFactor
	out := make([]float32, d/2)
	for i := range out {
		f := math.Pow(float64(c.RopeTheta), float64(2*i)/float64(d))
		wave := 2 * math.Pi * f
		switch {
		case wave > low:
			f *= s.Factor
		case wave > high:
			smooth := (float64(s.OriginalMax)/wave - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
			f = f / ((1-smooth)/s.Factor + smooth)
		}
		out[i] = float32(f)
	}
	return out
}

// invFreqs returns RoPE's inverse frequencies [d/2] (d the rotated dims)
// as MLX's fast.rope uses them: 1/freqs with ropeFreqs, else
// base**(-2i/d).
func invFreqs(c *modelConfig) []float32 {
	f := ropeFreqs(c)
	out := make([]float32, c.RotaryDim/2)
	for i := range out {
		if f != nil {
			out[i] = 1 / f[i]
		} else {
			out[i] = float32(math.Pow(float64(c.RopeTheta), -float64(2*i)/float64(c.RotaryDim)))
		}
	}
	return out
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b [20]byte
	n := len(b)
	for ; i > 0; i /= 10 {
		n--
		b[n] = byte('0' + i%10)
	}
	return string(b[n:])
}

package mlx

import (
	"fmt"
	"math"
)

// Phi-3 and Phi-4-mini (phi3): fused qkv_proj (rows [q | k | v]) and
// gate_up_proj (rows [gate | up]), RoPE on the first
// int(head_dim*partial_rotary_factor) dims of each head, and longrope
// scaling: per-frequency divisors, short_factor for a sequence within
// original_max_position_embeddings and long_factor beyond it, with the
// rotated dims scaled by sqrt(1 + ln(max/original)/ln(original)) when
// max_position_embeddings exceeds the original.

func phi3Fill(r *rawConfig, c *modelConfig) {
	c.FusedQKV, c.FusedGateUp = true, true
	uniformWindow(r, c)
	f := r.PartialRotary
	if f == 0 {
		f = 1
	}
	hd := r.HeadDim
	if hd == 0 && r.Heads > 0 {
		hd = r.Hidden / r.Heads
	}
	c.RotaryDim = int(float64(hd) * f)
}

// checkLongRoPE completes longrope scaling: its original length (from
// rope_scaling or config.json) and attention factor.
func (c *modelConfig) checkLongRoPE(r *rawConfig) string {
	s := &c.Rope
	if s.OriginalMax == 0 {
		s.OriginalMax = r.OriginalMaxPos
	}
	if s.OriginalMax <= 0 {
		s.OriginalMax = c.ContextLength
	}
	if n := c.RotaryDim / 2; len(s.ShortFactor) != n || len(s.LongFactor) != n {
		return fmt.Sprintf("rope_scaling longrope: %d short and %d long factors, want %d (rotary dims / 2)", len(s.ShortFactor), len(s.LongFactor), n)
	}
	for _, f := range append(append([]float64(nil), s.ShortFactor...), s.LongFactor...) {
		if f <= 0 {
			return "rope_scaling longrope: factors must be positive"
		}
	}
	if s.AttnFactor == 0 {
		s.AttnFactor = 1
		if factor := float64(c.ContextLength) / float64(s.OriginalMax); factor > 1 {
			s.AttnFactor = math.Sqrt(1 + math.Log(factor)/math.Log(float64(s.OriginalMax)))
		}
	}
	return ""
}

// longFreqs returns longrope's frequencies [RotaryDim/2] as MLX's fast
// rope takes them (factor * base**(2i/d)), short or long.
func longFreqs(c *modelConfig, long bool) []float32 {
	fs := c.Rope.ShortFactor
	if long {
		fs = c.Rope.LongFactor
	}
	d := c.RotaryDim
	out := make([]float32, d/2)
	for i := range out {
		out[i] = float32(fs[i] * math.Pow(float64(c.RopeTheta), float64(2*i)/float64(d)))
	}
	return out
}

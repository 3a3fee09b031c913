package mlx

import (
	"fmt"
	"math"
)

// YaRN (arXiv 2309.00071), rope_scaling type "yarn", as transformers
// computes it: rotary frequency i keeps base**(-2i/d) while it turns more
// than beta_fast times over original_max_position_embeddings positions,
// is divided by factor below beta_slow turns, and blends the two linearly
// by index in between; queries and keys are scaled on the rotated dims by
// an attention factor (attention_factor, else DeepSeek's mscale ratio,
// else 0.1·ln(factor) + 1).

// parseYarn reads rope_scaling m of type yarn into s; an original length
// left out is max_position_embeddings (completed by describe).
func parseYarn(m map[string]any, s ropeScaling) (ropeScaling, string) {
	bad := func(format string, a ...any) (ropeScaling, string) {
		return s, "rope_scaling yarn: " + fmt.Sprintf(format, a...)
	}
	// The numbers given (a null is left out).
	var nums [7]float64
	var has [7]bool
	for i, k := range []string{"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim"} {
		if v := m[k]; v != nil {
			f, ok := v.(float64)
			if !ok {
				return bad("%s %v: want a number", k, v)
			}
			nums[i], has[i] = f, true
		}
	}
	factor, orig, fast, slow, att, ms, msAll := nums[0], nums[1], nums[2], nums[3], nums[4], nums[5], nums[6]
	switch {
	case !has[0]:
		return bad("missing factor")
	case !(factor >= 1):
		return bad("factor %v must be at least 1", factor)
	case has[1] && !(orig > 0 && orig == math.Trunc(orig)):
		return bad("original_max_position_embeddings %v must be a positive integer", orig)
	}
	if fast == 0 { // transformers: beta_fast or 32, beta_slow or 1
		fast = 32
	}
	if slow == 0 {
		slow = 1
	}
	if !(0 < slow && slow <= fast) {
		return bad("beta_fast %v and beta_slow %v: want 0 < beta_slow <= beta_fast", fast, slow)
	}
	s.Truncate = true
	if v, ok := m["truncate"]; ok && v != nil {
		if s.Truncate, ok = v.(bool); !ok {
			return bad("truncate %v: want true or false", v)
		}
	}
	if !has[4] {
		att = yarnMscale(factor, 1)
		if ms != 0 && msAll != 0 {
			att = yarnMscale(factor, ms) / yarnMscale(factor, msAll)
		}
	}
	if !(att > 0) {
		return bad("attention factor %v (attention_factor, mscale, mscale_all_dim) must be positive", att)
	}
	s.Factor, s.OriginalMax, s.BetaFast, s.BetaSlow, s.AttnFactor = factor, int(orig), fast, slow, att
	return s, ""
}

// yarnMscale is YaRN's attention scale for a context grown by factor, with
// weight m on its logarithm.
func yarnMscale(factor, m float64) float64 {
	if factor <= 1 {
		return 1
	}
	return 0.1*m*math.Log(factor) + 1
}

// yarnFreqs returns YaRN's frequencies [RotaryDim/2] as MLX's fast rope
// takes them (1 / inverse frequency).
func yarnFreqs(c *modelConfig) []float32 {
	s, d, base := c.Rope, float64(c.RotaryDim), float64(c.RopeTheta)
	// The index whose frequency turns n times over the original length.
	at := func(n float64) float64 {
		return d * math.Log(float64(s.OriginalMax)/(n*2*math.Pi)) / (2 * math.Log(base))
	}
	lo, hi := at(s.BetaFast), at(s.BetaSlow)
	if s.Truncate {
		lo, hi = math.Floor(lo), math.Ceil(hi)
	}
	lo, hi = max(lo, 0), min(hi, d-1)
	if lo == hi {
		hi += 0.001
	}
	out := make([]float32, c.RotaryDim/2)
	for i := range out {
		inv := math.Pow(base, -float64(2*i)/d)
		w := min(max((float64(i)-lo)/(hi-lo), 0), 1) // 0: as is, 1: divided by factor
		out[i] = float32(1 / (w*inv/s.Factor + (1-w)*inv))
	}
	return out
}

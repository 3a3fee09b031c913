package mlx

import (
	"math"
	"strings"
	"testing"
)

func TestRopeScalingYarn(t *testing.T) {
	c := &modelConfig{HeadDim: 16, RopeTheta: 10000, ContextLength: 128}
	c.RotaryDim, c.Block, c.Act = 16, preNorm, "silu"
	for _, tc := range []struct {
		name  string
		m     map[string]any
		att   float64
		lo    int // the last index kept as is
		hi    int // the first index divided by factor
		trunc bool
	}{
		// Qwen's spelling (type, not rope_type). Bounds: beta_fast 32
		// turns over 32 positions is index -1.6, floored to 0; beta_slow
		// 1 turn is index 1.41, ceiled to 2.
		{"qwen", map[string]any{"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32.0},
			0.1*math.Log(4) + 1, 0, 2, true},
		{"mscale", map[string]any{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32.0,
			"mscale": 1.0, "mscale_all_dim": 0.5, "truncate": false},
			(0.1*math.Log(4) + 1) / (0.05*math.Log(4) + 1), 0, 2, false},
		{"attention factor", map[string]any{"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.0}, 1, 0, 3, true},
	} {
		s, reason := parseRopeScaling(tc.m)
		if reason != "" {
			t.Fatalf("%s: %s", tc.name, reason)
		}
		c.Rope = s
		if reason := c.describe(&rawConfig{}); reason != "" {
			t.Fatalf("%s: %s", tc.name, reason)
		}
		if math.Abs(s.AttnFactor-tc.att) > 1e-12 || s.Truncate != tc.trunc {
			t.Errorf("%s: attention factor %v, truncate %v; want %v, %v", tc.name, s.AttnFactor, s.Truncate, tc.att, tc.trunc)
		}
		f := ropeFreqs(c)
		for i := range f {
			plain := math.Pow(10000, float64(2*i)/16)
			if i <= tc.lo && math.Abs(float64(f[i])/plain-1) > 1e-6 {
				t.Errorf("%s: frequency %d is %v, want %v kept", tc.name, i, f[i], plain)
			}
			if i >= tc.hi && math.Abs(float64(f[i])/(4*plain)-1) > 1e-6 {
				t.Errorf("%s: frequency %d is %v, want %v divided by 4", tc.name, i, f[i], plain)
			}
		}
	}
	if c.Rope.OriginalMax != 128 {
		t.Errorf("original length %d, want max_position_embeddings 128", c.Rope.OriginalMax)
	}
	// Served: the original length times the factor where that is more
	// (the last case: 128 x 4); the first two kept max_position_embeddings
	// (32 x 4 = 128).
	if c.ContextLength != 512 {
		t.Errorf("served context %d, want 128 x factor 4 = 512", c.ContextLength)
	}
	if !c.plainDecode() {
		t.Error("yarn with attention factor 1 leaves the fused decode kernels")
	}
}

func TestRopeScalingYarnRefused(t *testing.T) {
	for _, tc := range []struct {
		m    map[string]any
		want string
	}{
		{map[string]any{"type": "yarn"}, "missing factor"},
		{map[string]any{"type": "yarn", "factor": 0.5}, "factor 0.5"},
		{map[string]any{"type": "yarn", "factor": "4"}, "factor 4: want a number"},
		{map[string]any{"type": "yarn", "factor": 4.0, "beta_fast": 1.0, "beta_slow": 32.0}, "beta_fast"},
		{map[string]any{"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0.0}, "original_max_position_embeddings"},
		{map[string]any{"type": "yarn", "factor": 4.0, "truncate": 1.0}, "truncate"},
		{map[string]any{"type": "yarn", "factor": 4.0, "attention_factor": -1.0}, "attention factor"},
	} {
		if _, reason := parseRopeScaling(tc.m); !strings.Contains(reason, tc.want) {
			t.Errorf("%v: %q, want it to name %q", tc.m, reason, tc.want)
		}
	}
}

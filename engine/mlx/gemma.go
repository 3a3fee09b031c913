package mlx

import (
	"encoding/json"
	"math"
)

// Gemma 2 and Gemma 3 (gemma2, gemma3_text, and gemma3's text_config):
// four norms a layer that scale by 1 + weight, GELU-tanh, embeddings
// scaled by sqrt(hidden), queries by query_pre_attn_scalar**-0.5, and
// interleaved sliding-window layers. Gemma 2 soft-caps attention and
// output logits; Gemma 3 norms queries and keys per head and rotates its
// sliding layers with rope_local_base_freq, unscaled. Defaults are
// transformers' Gemma2Config and Gemma3TextConfig: published Gemma 3
// text_configs leave most fields out.

func gemmaCommon(r *rawConfig, c *modelConfig) {
	c.Block, c.NormPlusOne = sandwich, true
	c.Act = "gelu_pytorch_tanh"
	if r.HiddenActivation != "" {
		c.Act = r.HiddenActivation
	}
	if c.HeadDim == 0 {
		c.HeadDim = 256
	}
	if c.NormEps == 0 {
		c.NormEps = 1e-6
	}
	c.EmbedScale = float32(math.Sqrt(float64(c.Hidden)))
	qpas := r.QueryPreAttnScalar
	if qpas == 0 {
		qpas = 256
	}
	c.AttnScale = float32(1 / math.Sqrt(qpas))
	c.Window = 4096
	if r.SlidingWindow != nil {
		c.Window = *r.SlidingWindow
	}
}

func gemma2Fill(r *rawConfig, c *modelConfig) {
	gemmaCommon(r, c)
	if c.Vocab == 0 {
		c.Vocab = 256000
	}
	if c.ContextLength == 0 {
		c.ContextLength = 8192
	}
	c.AttnCap, c.FinalCap = softcap(r.AttnSoftcap, 50), softcap(r.FinalSoftcap, 30)
	c.Sliding = interleaved(r.Layers, 2)
}

func gemma3Fill(r *rawConfig, c *modelConfig) {
	gemmaCommon(r, c)
	c.QKNorm = true
	if c.Vocab == 0 {
		c.Vocab = 262208
	}
	if c.ContextLength == 0 {
		c.ContextLength = 131072
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 1e6
	}
	c.LocalRopeTheta = float32(r.RopeLocalBase)
	if c.LocalRopeTheta == 0 {
		c.LocalRopeTheta = 10000
	}
	c.AttnCap, c.FinalCap = softcap(r.AttnSoftcap, 0), softcap(r.FinalSoftcap, 0)
	pattern := r.SlidingPattern
	if pattern == 0 {
		pattern = 6
	}
	c.Sliding = interleaved(r.Layers, pattern) // layer_types, when given, replaces it (describe)
}

// interleaved marks layer i sliding unless (i+1) % pattern == 0: Gemma 2's
// even layers (pattern 2), Gemma 3's sliding_window_pattern.
func interleaved(layers, pattern int) []bool {
	if layers <= 0 || layers > maxLayers {
		return nil
	}
	out := make([]bool, layers)
	for i := range out {
		out[i] = (i+1)%pattern != 0
	}
	return out
}

// softcap reads a soft-capping entry: def when absent, 0 (none) when null.
func softcap(raw json.RawMessage, def float64) float32 {
	if len(raw) == 0 {
		return float32(def)
	}
	var v *float64
	if json.Unmarshal(raw, &v) != nil || v == nil || *v <= 0 {
		return 0
	}
	return float32(*v)
}

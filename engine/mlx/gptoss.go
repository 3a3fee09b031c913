package mlx

import (
	"fmt"
	"slices"

	"github.com/mlxserving/mlxserving/engine"
)

// gpt-oss (gpt_oss): q, k, v and o with biases, a learned attention sink
// per head (self_attn.sinks: a logit each row's softmax includes, then
// drops), layers sliding and full by layer_types, YaRN, and a mixture
// of experts in every layer: mlp.router (with a bias) picks the top-k
// logits and softmaxes over those k; the experts are stacked tensors
// with biases, gate_up_proj [E, hidden, 2·inter] (gate and up
// interleaved: columns 2j and 2j+1) and down_proj [E, inter, hidden],
// and compute ((up + 1) · gate·σ(1.702·gate)) @ down with gate clamped
// to at most swiglu_limit and up to ±swiglu_limit.
//
// OpenAI publishes the experts in MXFP4 (quant_method "mxfp4"):
// name_blocks U8 [E, out, in/32, 16] (two E2M1 values a byte, the even
// one in the low nibble) and name_scales U8 [E, out, in/32] (E8M0). That
// is MLX's own mxfp4 layout, bytes for bytes (the blocks read as uint32
// words [E, out, in/8]), so the experts stay in MXFP4 and run through
// gather_qmm in mode mxfp4; dequantized checkpoints (bfloat16 experts)
// run through gather_mm.

// gptOssGLUScale is gpt-oss's gate activation constant: gate·σ(1.702·gate).
const gptOssGLUScale = 1.702

func gptOssFill(r *rawConfig, c *modelConfig) {
	c.QKVBias, c.OBias, c.Sinks = true, true, true
	if r.SlidingWindow != nil { // layer_types says which layers slide (describe)
		c.Window = *r.SlidingWindow
	}
	limit := r.SwiGLULimit
	if limit == 0 {
		limit = 7
	}
	m := &moeConfig{Router: "mlp.router", Expert: "mlp.experts.", Gate: "gate_up_proj", Down: "down_proj",
		Experts: r.NumExperts, TopK: r.ExpertsPerToken, Inter: r.Intermediate, Stacked: true, SoftmaxTopK: true,
		Limit: float32(limit)}
	if r.Layers > 0 && r.Layers <= maxLayers {
		m.Sparse = make([]bool, r.Layers)
		for i := range m.Sparse {
			m.Sparse[i] = true
		}
	}
	c.MoE = m
}

// stackedModules lists a gpt-oss layer's router and its stacked experts.
func stackedModules(c *modelConfig, p string) []module {
	m := c.MoE
	e := p + m.Expert
	return []module{
		{Name: p + m.Router, Out: m.Experts, In: c.Hidden, Bias: true},
		{Name: e + m.Gate, Out: 2 * m.Inter, In: c.Hidden, Experts: m.Experts, Bias: true},
		{Name: e + m.Down, Out: c.Hidden, In: m.Inter, Experts: m.Experts, Bias: true},
	}
}

// mxfp4Group is the number of inputs sharing one MXFP4 scale.
const mxfp4Group = 32

// checkStacked checks stacked experts m: float name [E, in, out], or
// with quant_method mxfp4 name_blocks U8 [E, out, in/32, 16] and
// name_scales U8 [E, out, in/32]; and name_bias [E, out].
func checkStacked(c *modelConfig, m *module, man map[string]tensorInfo) error {
	bad := func(tensor, reason string) error {
		return &engine.CheckpointError{Path: man[tensor].File, Tensor: tensor, Reason: reason}
	}
	missing := func(tensor string) error {
		return &engine.CheckpointError{Path: "model.safetensors", Tensor: tensor, Reason: "missing"}
	}
	shape := func(tensor string, want []int) error {
		t, ok := man[tensor]
		if !ok {
			return missing(tensor)
		}
		if !slices.Equal(t.Shape, want) {
			return bad(tensor, fmt.Sprintf("shape %v contradicts config.json (want %v)", t.Shape, want))
		}
		return nil
	}
	e, out, in := m.Experts, m.Out, m.In
	if _, float := man[m.Name]; float || c.HF == nil || c.HF.Method != "mxfp4" {
		if err := shape(m.Name, []int{e, in, out}); err != nil {
			return err
		}
		if err := checkFloat(m.Name, man[m.Name]); err != nil {
			return err
		}
	} else {
		if in%mxfp4Group != 0 {
			return bad(m.Name+"_blocks", fmt.Sprintf("input size %d is not a multiple of MXFP4's blocks of %d", in, mxfp4Group))
		}
		g := in / mxfp4Group
		for _, t := range []struct {
			name  string
			shape []int
		}{{m.Name + "_blocks", []int{e, out, g, mxfp4Group / 2}}, {m.Name + "_scales", []int{e, out, g}}} {
			if err := shape(t.name, t.shape); err != nil {
				return err
			}
			if dt := man[t.name].DType; dt != "U8" {
				return bad(t.name, fmt.Sprintf("dtype %s: want U8", dt))
			}
		}
		m.Quant = &quantParams{GroupSize: mxfp4Group, Bits: 4, Mode: "mxfp4"}
	}
	if err := shape(m.Name+"_bias", []int{e, out}); err != nil {
		return err
	}
	return checkFloat(m.Name+"_bias", man[m.Name+"_bias"])
}

// stackedTensors are the tensors a stacked-experts or bare module m may
// load (those the checkpoint lacks are not read).
func stackedTensors(m module) []string {
	if m.Experts == 0 {
		return []string{m.Name}
	}
	return []string{m.Name, m.Name + "_blocks", m.Name + "_scales", m.Name + "_bias"}
}

package mlx

import (
	"fmt"
	"slices"
	"strings"

	"github.com/mlxserving/mlxserving/engine"
	"github.com/mlxserving/mlxserving/internal/safetensors"
)

// module is one weight-bearing module of the model: a linear layer, an
// embedding or a norm, with the shape config.json implies.
type module struct {
	Name  string // "model.layers.0.self_attn.q_proj"
	Out   int    // rows (norms: size)
	In    int    // columns (0 for norms)
	Bias  bool
	Quant *quantParams // nil when stored in float
	// Experts > 0: experts stacked in one tensor named Name, with
	// Name_bias (gpt-oss: checkStacked); Bare: one tensor named Name of
	// Out values (gpt-oss's sinks).
	Experts int
	Bare    bool
}

// layerModules lists layer i's modules in Hugging Face naming, under the
// checkpoint's prefix (c.Prefix).
func layerModules(c *modelConfig, i int) []module {
	p := c.Prefix + "layers." + itoa(i) + "."
	q, kv := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	norm := func(name string) module { return module{Name: p + name, Out: c.Hidden} }
	var ms []module
	if c.Block != postNorm {
		ms = append(ms, norm("input_layernorm"))
	}
	ms = append(ms, norm("post_attention_layernorm"))
	switch c.Block {
	case sandwich:
		ms = append(ms, norm("pre_feedforward_layernorm"), norm("post_feedforward_layernorm"))
	case postNorm:
		ms = append(ms, norm("post_feedforward_layernorm"))
	}
	if c.FusedQKV {
		ms = append(ms, module{Name: p + "self_attn.qkv_proj", Out: q + 2*kv, In: c.Hidden, Bias: c.QKVBias})
	} else {
		ms = append(ms,
			module{Name: p + "self_attn.q_proj", Out: q, In: c.Hidden, Bias: c.QKVBias},
			module{Name: p + "self_attn.k_proj", Out: kv, In: c.Hidden, Bias: c.QKVBias},
			module{Name: p + "self_attn.v_proj", Out: kv, In: c.Hidden, Bias: c.QKVBias})
	}
	ms = append(ms, module{Name: p + "self_attn.o_proj", Out: c.Hidden, In: q, Bias: c.OBias})
	if c.Sinks {
		ms = append(ms, module{Name: p + "self_attn.sinks", Out: c.Heads, Bare: true})
	}
	switch {
	case c.QKNorm && c.QKNormWhole:
		ms = append(ms, module{Name: p + "self_attn.q_norm", Out: q}, module{Name: p + "self_attn.k_norm", Out: kv})
	case c.QKNorm:
		ms = append(ms, module{Name: p + "self_attn.q_norm", Out: c.HeadDim}, module{Name: p + "self_attn.k_norm", Out: c.HeadDim})
	}
	return append(ms, mlpModules(c, i, p)...)
}

// mlpModules lists layer i's MLP: dense, fused (gate_up_proj) or a
// router and its experts.
func mlpModules(c *modelConfig, i int, p string) []module {
	if c.sparse(i) && c.MoE.Stacked {
		return stackedModules(c, p)
	}
	if c.sparse(i) {
		m := c.MoE
		ms := []module{{Name: p + m.Router, Out: m.Experts, In: c.Hidden}}
		for j := range m.Experts {
			e := p + fmt.Sprintf(m.Expert, j)
			ms = append(ms,
				module{Name: e + m.Gate, Out: m.Inter, In: c.Hidden},
				module{Name: e + m.Up, Out: m.Inter, In: c.Hidden},
				module{Name: e + m.Down, Out: c.Hidden, In: m.Inter})
		}
		return ms
	}
	if c.FusedGateUp {
		return []module{
			{Name: p + "mlp.gate_up_proj", Out: 2 * c.Intermediate, In: c.Hidden},
			{Name: p + "mlp.down_proj", Out: c.Hidden, In: c.Intermediate},
		}
	}
	return []module{
		{Name: p + "mlp.gate_proj", Out: c.Intermediate, In: c.Hidden},
		{Name: p + "mlp.up_proj", Out: c.Intermediate, In: c.Hidden},
		{Name: p + "mlp.down_proj", Out: c.Hidden, In: c.Intermediate},
	}
}

// topModules lists the embedding, final norm and output head.
func topModules(c *modelConfig) []module {
	ms := []module{
		{Name: c.Prefix + "embed_tokens", Out: c.Vocab, In: c.Hidden},
		{Name: c.Prefix + "norm", Out: c.Hidden},
	}
	if !c.Tied && c.Head != "" {
		ms = append(ms, module{Name: c.Head, Out: c.Vocab, In: c.Hidden})
	}
	return ms
}

// layouts are where checkpoints keep the language model: transformers'
// causal LMs, multimodal ones (Gemma 3) as Google published them
// (transformers before 4.52) and as newer transformers writes them, and
// the bare model (Qwen3Model) as embedding checkpoints publish it, with
// no output head: untied, it only embeds (headless). The tensors of
// other towers (vision_tower, multi_modal_projector) are never read.
var layouts = []struct{ prefix, head string }{
	{"model.", "lm_head"},
	{"language_model.model.", "language_model.lm_head"},
	{"model.language_model.", "lm_head"},
	{"", ""},
}

// headless reports a bare model without an output head (untied, no
// lm_head): it embeds and cannot generate.
func (c *modelConfig) headless() bool { return !c.Tied && c.Head == "" }

// locate sets c.Prefix and c.Head from the checkpoint's tensor names:
// the first layout whose embedding is there (the first layout when none
// is, so that the error names the tensor a causal LM would have).
func locate(c *modelConfig, man map[string]tensorInfo) {
	c.Prefix, c.Head = layouts[0].prefix, layouts[0].head
	for _, l := range layouts {
		if _, ok := man[l.prefix+"embed_tokens.weight"]; ok {
			c.Prefix, c.Head = l.prefix, l.head
			return
		}
	}
}

// planModules checks every module against the checkpoint's tensors and
// decides which are quantized (those stored with .scales, as MLX writes
// them). It returns the modules in load order.
func planModules(c *modelConfig, man map[string]tensorInfo) ([]module, error) {
	locate(c, man)
	ms := topModules(c)
	for i := 0; i < c.Layers; i++ {
		ms = append(ms, layerModules(c, i)...)
	}
	for i := range ms {
		if err := checkModule(c, &ms[i], man); err != nil {
			return nil, err
		}
	}
	return ms, nil
}

func checkModule(c *modelConfig, m *module, man map[string]tensorInfo) error {
	w := m.Name + ".weight"
	switch {
	case m.Experts > 0:
		return checkStacked(c, m, man)
	case m.Bare:
		w = m.Name
	}
	t, ok := man[w]
	if !ok {
		return &engine.CheckpointError{Path: "model.safetensors", Tensor: w, Reason: "missing"}
	}
	bad := func(tensor, reason string) error {
		return &engine.CheckpointError{Path: man[tensor].File, Tensor: tensor, Reason: reason}
	}
	if m.In == 0 { // a norm
		if !slices.Equal(t.Shape, []int{m.Out}) {
			return bad(w, fmt.Sprintf("shape %v contradicts config.json (want [%d])", t.Shape, m.Out))
		}
		return checkFloat(w, t)
	}
	if _, quant := man[m.Name+".scales"]; quant {
		if err := checkQuantized(c, m, man); err != nil {
			return err
		}
	} else {
		if !slices.Equal(t.Shape, []int{m.Out, m.In}) {
			return bad(w, fmt.Sprintf("shape %v contradicts config.json (want [%d %d])", t.Shape, m.Out, m.In))
		}
		if err := checkFloat(w, t); err != nil {
			return err
		}
	}
	if m.Bias {
		b := m.Name + ".bias"
		bt, ok := man[b]
		if !ok {
			return &engine.CheckpointError{Path: t.File, Tensor: b, Reason: "missing"}
		}
		if !slices.Equal(bt.Shape, []int{m.Out}) {
			return bad(b, fmt.Sprintf("shape %v contradicts config.json (want [%d])", bt.Shape, m.Out))
		}
	}
	return nil
}

func checkFloat(name string, t tensorInfo) error {
	switch t.DType {
	case "F32", "F16", "BF16":
		return nil
	}
	return &engine.CheckpointError{Path: t.File, Tensor: name, Reason: fmt.Sprintf("dtype %s: want F32, F16 or BF16", t.DType)}
}

func checkQuantized(c *modelConfig, m *module, man map[string]tensorInfo) error {
	w := man[m.Name+".weight"]
	p, ok := c.Quant.params(m.Name)
	if !ok {
		return &engine.CheckpointError{Path: w.File, Tensor: m.Name + ".scales",
			Reason: "quantized weights but config.json has no quantization entry for this module"}
	}
	if m.In%p.GroupSize != 0 || (m.In*p.Bits)%32 != 0 {
		return &engine.CheckpointError{Path: w.File, Tensor: m.Name + ".weight",
			Reason: fmt.Sprintf("input size %d does not pack into %d-bit groups of %d", m.In, p.Bits, p.GroupSize)}
	}
	want := map[string][]int{
		".weight": {m.Out, m.In * p.Bits / 32},
		".scales": {m.Out, m.In / p.GroupSize},
		".biases": {m.Out, m.In / p.GroupSize},
	}
	for suffix, shape := range want {
		name := m.Name + suffix
		t, ok := man[name]
		if !ok {
			return &engine.CheckpointError{Path: w.File, Tensor: name, Reason: "missing"}
		}
		if !slices.Equal(t.Shape, shape) {
			return &engine.CheckpointError{Path: t.File, Tensor: name,
				Reason: fmt.Sprintf("shape %v contradicts config.json (want %v for %d-bit, group %d)", t.Shape, shape, p.Bits, p.GroupSize)}
		}
	}
	if w.DType != "U32" {
		return &engine.CheckpointError{Path: w.File, Tensor: m.Name + ".weight", Reason: fmt.Sprintf("quantized weight dtype %s: want U32", w.DType)}
	}
	m.Quant = &p
	return nil
}

// weightBytes is the size of the checkpoint's weights.
func weightBytes(man map[string]tensorInfo) uint64 {
	var n uint64
	for name, t := range man {
		if isVisionTensor(name) {
			continue // never loaded: the engine serves the language model
		}
		size, _ := safetensors.DTypeSize(t.DType)
		b := uint64(size)
		for _, d := range t.Shape {
			b *= uint64(d)
		}
		n += b
	}
	return n
}

// isVisionTensor reports whether a multimodal checkpoint's tensor belongs
// to its vision tower or projector (Gemma 3), which the engine leaves on
// disk.
func isVisionTensor(name string) bool {
	for _, p := range []string{"vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

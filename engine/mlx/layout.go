package mlx

import (
	"fmt"
	"slices"

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
}

// layerModules lists layer i's modules in Hugging Face naming.
func layerModules(c *modelConfig, i int) []module {
	p := fmt.Sprintf("model.layers.%d.", i)
	q, kv := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	ms := []module{
		{Name: p + "input_layernorm", Out: c.Hidden},
		{Name: p + "self_attn.q_proj", Out: q, In: c.Hidden, Bias: c.QKVBias},
		{Name: p + "self_attn.k_proj", Out: kv, In: c.Hidden, Bias: c.QKVBias},
		{Name: p + "self_attn.v_proj", Out: kv, In: c.Hidden, Bias: c.QKVBias},
		{Name: p + "self_attn.o_proj", Out: c.Hidden, In: q},
		{Name: p + "post_attention_layernorm", Out: c.Hidden},
		{Name: p + "mlp.gate_proj", Out: c.Intermediate, In: c.Hidden},
		{Name: p + "mlp.up_proj", Out: c.Intermediate, In: c.Hidden},
		{Name: p + "mlp.down_proj", Out: c.Hidden, In: c.Intermediate},
	}
	if c.QKNorm {
		ms = append(ms, module{Name: p + "self_attn.q_norm", Out: c.HeadDim}, module{Name: p + "self_attn.k_norm", Out: c.HeadDim})
	}
	return ms
}

// topModules lists the embedding, final norm and output head.
func topModules(c *modelConfig) []module {
	ms := []module{
		{Name: "model.embed_tokens", Out: c.Vocab, In: c.Hidden},
		{Name: "model.norm", Out: c.Hidden},
	}
	if !c.Tied {
		ms = append(ms, module{Name: "lm_head", Out: c.Vocab, In: c.Hidden})
	}
	return ms
}

// planModules checks every module against the checkpoint's tensors and
// decides which are quantized (those stored with .scales, as MLX writes
// them). It returns the modules in load order.
func planModules(c *modelConfig, man map[string]tensorInfo) ([]module, error) {
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
	for _, t := range man {
		size, _ := safetensors.DTypeSize(t.DType)
		b := uint64(size)
		for _, d := range t.Shape {
			b *= uint64(d)
		}
		n += b
	}
	return n
}

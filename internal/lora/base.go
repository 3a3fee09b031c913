package lora

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"sort"
)

// Base is what an adapter is checked against: the model's layers and the
// projections it adapts, with their input and output widths.
type Base struct {
	Layers int
	// Modules maps "self_attn.q_proj" and the like to [in, out].
	Modules map[string][2]int
	// Dense, for a mixture of experts, says which layers have a plain MLP
	// (adaptable); nil when every layer has one.
	Dense map[int]bool
}

// ModuleNames lists Modules' keys, sorted.
func (b Base) ModuleNames() []string {
	var out []string
	for k := range b.Modules {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// ReadBase reads the projections' widths from the config.json of the
// checkpoint in dir (the language model's text_config for multimodal
// Gemma 3). Encoders are refused: adapters are served on decoders.
func ReadBase(dir string) (Base, error) {
	path := filepath.Join(dir, "config.json")
	raw, err := readSmall(path)
	if err != nil {
		return Base{}, err
	}
	type cfg struct {
		ModelType    string          `json:"model_type"`
		Text         json.RawMessage `json:"text_config"`
		Layers       int             `json:"num_hidden_layers"`
		Hidden       int             `json:"hidden_size"`
		Heads        int             `json:"num_attention_heads"`
		KVHeads      int             `json:"num_key_value_heads"`
		HeadDim      int             `json:"head_dim"`
		Intermediate int             `json:"intermediate_size"`
		Experts      int             `json:"num_experts"`
		LocalExperts int             `json:"num_local_experts"`
		MLPOnly      []int           `json:"mlp_only_layers"`
		SparseStep   int             `json:"decoder_sparse_step"`
	}
	var c cfg
	if err := json.Unmarshal(raw, &c); err != nil {
		return Base{}, bad(path, "", "not a JSON object: %v", err)
	}
	if len(c.Text) > 0 && string(c.Text) != "null" {
		mt := c.ModelType
		if err := json.Unmarshal(c.Text, &c); err != nil {
			return Base{}, bad(path, "", "text_config: %v", err)
		}
		c.ModelType = mt
	}
	switch c.ModelType {
	case "bert", "modernbert", "xlm-roberta", "roberta":
		return Base{}, bad(path, "", "model_type %q is an encoder: adapters are served on decoders", c.ModelType)
	}
	if c.Layers <= 0 || c.Hidden <= 0 || c.Heads <= 0 || c.Intermediate <= 0 {
		return Base{}, bad(path, "", "num_hidden_layers, hidden_size, num_attention_heads and intermediate_size must be positive")
	}
	if c.KVHeads <= 0 {
		c.KVHeads = c.Heads
	}
	hd := c.HeadDim
	if hd <= 0 {
		hd = c.Hidden / c.Heads
	}
	h, q, kv, inter := c.Hidden, c.Heads*hd, c.KVHeads*hd, c.Intermediate
	b := Base{Layers: c.Layers, Modules: map[string][2]int{"self_attn.o_proj": {q, h}}}
	if c.ModelType == "phi3" { // fused projections
		b.Modules["self_attn.qkv_proj"] = [2]int{h, q + 2*kv}
		b.Modules["mlp.gate_up_proj"] = [2]int{h, 2 * inter}
	} else {
		b.Modules["self_attn.q_proj"] = [2]int{h, q}
		b.Modules["self_attn.k_proj"] = [2]int{h, kv}
		b.Modules["self_attn.v_proj"] = [2]int{h, kv}
		b.Modules["mlp.gate_proj"] = [2]int{h, inter}
		b.Modules["mlp.up_proj"] = [2]int{h, inter}
	}
	b.Modules["mlp.down_proj"] = [2]int{inter, h}
	switch {
	case c.ModelType == "mixtral":
		b.Dense = map[int]bool{} // every layer's MLP is block_sparse_moe
	case max(c.Experts, c.LocalExperts) > 0: // qwen3_moe: sparse every decoder_sparse_step-th layer unless listed dense
		step := max(c.SparseStep, 1)
		b.Dense = map[int]bool{}
		for i := range c.Layers {
			b.Dense[i] = slices.Contains(c.MLPOnly, i) || (i+1)%step != 0
		}
	}
	return b, nil
}

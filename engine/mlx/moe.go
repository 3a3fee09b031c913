package mlx

import (
	"fmt"
	"math"
	"slices"
)

// Mixtures of experts (qwen3_moe, mixtral): a router picks the top-k of
// E SwiGLU experts per token (softmax in float32, then top-k; Mixtral
// always renormalises the k weights, Qwen3-MoE when norm_topk_prob). The
// checkpoint stores each expert's projections; the loader stacks them
// into [E, out, in] tensors that MLX's gather_mm (gather_qmm when
// quantized) reads by expert index (switch.go).

// moeConfig is the mixture of a model's sparse layers.
type moeConfig struct {
	Router   string // router module under the layer ("mlp.gate")
	Expert   string // expert j's prefix under the layer, with %d ("mlp.experts.%d.")
	Gate     string // expert projection names
	Up       string
	Down     string
	Experts  int
	TopK     int
	Inter    int  // an expert's intermediate size
	NormTopK bool // renormalise the top-k weights to sum to 1
	Sparse   []bool
	// Stacked experts (gpt-oss, gptoss.go): Expert is the experts'
	// prefix (no %d), Gate names gate_up_proj [E, in, 2·Inter] with gate
	// and up interleaved, Down down_proj [E, Inter, out], each with a
	// name_bias [E, out]; the router has a bias.
	Stacked bool
	// SoftmaxTopK: the weights are the softmax of the top-k logits
	// (gpt-oss), not the top-k of the softmax.
	SoftmaxTopK bool
	// Limit clamps the experts' gate to at most Limit and up to ±Limit
	// in gpt-oss's GLU, (up + 1)·gate·σ(1.702·gate); 0: SwiGLU.
	Limit float32
}

func (m *moeConfig) check(c *modelConfig) string {
	switch {
	case m.Experts <= 0 || m.Experts > maxExperts || m.TopK <= 0 || m.TopK > m.Experts:
		return fmt.Sprintf("experts %d, per token %d: want 0 < num_experts_per_tok <= experts <= %d", m.Experts, m.TopK, maxExperts)
	case m.Inter <= 0 || m.Inter > 4*maxHidden:
		return fmt.Sprintf("expert intermediate size %d out of range", m.Inter)
	case len(m.Sparse) != c.Layers:
		return "expert layers do not match num_hidden_layers"
	case m.Stacked && !(m.Limit > 0 && m.Limit < math.MaxFloat32):
		return fmt.Sprintf("swiglu_limit %v: want a positive number", m.Limit)
	}
	return ""
}

// maxExperts bounds num_experts far above any published model.
const maxExperts = 1 << 12

// sparse reports whether layer li is a mixture of experts.
func (c *modelConfig) sparse(li int) bool {
	return c.MoE != nil && c.MoE.Sparse[li]
}

// qwen3MoEFill: mlp.gate over mlp.experts.j.{gate,up,down}_proj of width
// moe_intermediate_size; layer i is sparse unless it is in
// mlp_only_layers or (i+1) % decoder_sparse_step != 0, where it has a
// dense MLP of intermediate_size.
func qwen3MoEFill(r *rawConfig, c *modelConfig) {
	qwen3Fill(r, c)
	step := r.SparseStep
	if step <= 0 {
		step = 1
	}
	m := &moeConfig{Router: "mlp.gate", Expert: "mlp.experts.%d.", Gate: "gate_proj", Up: "up_proj", Down: "down_proj",
		Experts: r.NumExperts, TopK: r.ExpertsPerToken, Inter: r.MoEIntermediate, NormTopK: r.NormTopKProb != nil && *r.NormTopKProb}
	if r.Layers > 0 && r.Layers <= maxLayers {
		m.Sparse = make([]bool, r.Layers)
		for i := range m.Sparse {
			m.Sparse[i] = m.Experts > 0 && !slices.Contains(r.MLPOnlyLayers, i) && (i+1)%step == 0
		}
	}
	c.MoE = m
}

// mixtralFill: block_sparse_moe.gate over block_sparse_moe.experts.j.{w1
// (gate), w3 (up), w2 (down)} of width intermediate_size on every layer.
func mixtralFill(r *rawConfig, c *modelConfig) {
	uniformWindow(r, c)
	m := &moeConfig{Router: "block_sparse_moe.gate", Expert: "block_sparse_moe.experts.%d.", Gate: "w1", Up: "w3", Down: "w2",
		Experts: r.NumLocalExperts, TopK: r.ExpertsPerToken, Inter: r.Intermediate, NormTopK: true}
	if r.Layers > 0 && r.Layers <= maxLayers {
		m.Sparse = make([]bool, r.Layers)
		for i := range m.Sparse {
			m.Sparse[i] = true
		}
	}
	c.MoE = m
}

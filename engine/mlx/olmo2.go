package mlx

// OLMo 2 (olmo2): no input norm; the attention and MLP outputs are normed
// before the residual adds (post_attention_layernorm,
// post_feedforward_layernorm), and q_norm and k_norm span the whole q and
// k projections, before the head split.
func olmo2Fill(r *rawConfig, c *modelConfig) {
	c.Block, c.QKNorm, c.QKNormWhole = postNorm, true, true
}

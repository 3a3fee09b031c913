"""Phi-3 (and Phi-4-mini): fused projections.

qkv_proj holds the rows of q, k and v in that order ([H * hd | K * hd |
K * hd]) and gate_up_proj those of gate and up: the decoder's own packed
layouts, so they load as they are. Partial rotary (partial_rotary_factor)
and longrope are rope.py's; the sliding window is config.py's.
"""


def qkv(get, cfg, p):
    """The fused q, k, v projection of attention prefix p."""
    return get(p + "qkv_proj.weight", ((cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim, cfg.hidden))


def gate_up(get, cfg, p):
    """The fused gate and up projection of MLP prefix p: up * silu(gate)."""
    return get(p + "gate_up_proj.weight", (2 * cfg.intermediate, cfg.hidden))

"""Gemma 2 and Gemma 3: what their decoder does that others do not.

The rest is data in config.py's table: the (1 + w) RMSNorm in float32,
four norms a layer (before and after attention and the MLP), GELU-tanh,
query_pre_attn_scalar, per-head QK norm (Gemma 3), sliding layers
(layer_types, else Gemma 3's sliding_window_pattern or Gemma 2's even
layers), the local layers' RoPE base (Gemma 3's rope_local_base_freq,
unscaled).
"""
import math

import torch


def embed_scale(cfg, device, dtype):
    """The factor the embedding rows are multiplied by, sqrt(hidden) in
    the weights' dtype (as transformers rounds it), or None."""
    if not cfg.family.gemma:
        return None
    return torch.tensor(math.sqrt(cfg.hidden), dtype=dtype, device=device)


def softcap(x, cap):
    """Gemma 2's soft-capping: tanh(x / cap) * cap (attention scores before
    the mask, and the final logits)."""
    return torch.tanh(x / cap) * cap

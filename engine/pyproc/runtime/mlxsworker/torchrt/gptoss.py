"""gpt_oss (OpenAI's gpt-oss-20b and -120b): what its decoder does that
others do not.

Attention: q, k, v and o with biases, and a learned sink per head
(self_attn.sinks): a logit each row's softmax includes as one more column
and then drops, so a head may attend to nothing. Layers alternate sliding
and full attention (layer_types, config.py); RoPE is YaRN (rope.py); the
RMSNorm is w * (x / rms) in float32, one rounding (config.py's "olmo2"
norm).

The sink only adds exp(s_h) to each row's softmax denominator, so on CUDA
the family runs the dense families' fast paths: the Triton decode kernel
adds exp(s_h - m) to its final denominator (after the split-K combine
where the cache is split), and the varlen flash call's output is rescaled
by its log-sum-exp L: out * sigmoid(L - s_h) (with_sinks), sliding layers
keeping their flash window. Decode steps replay CUDA graphs where the
experts' grouped GEMM captures (moe.Experts.capturable). What stays off:
SDPA (it returns no log-sum-exp), so prompt chunks the varlen call does
not take (float32 models, or its load-time check failed: decoder's
_varlen_ok) attend with the plain torch code (softmax_sinks), which
materializes each chunk's scores: long prompts want bfloat16 or float16;
and the prompt-step graphs (prefill.py), which exclude mixtures of
experts.

MLP: a mixture of experts in every layer. The router (mlp.router, with a
bias) takes the top k of its logits and a softmax over those k. Expert j
is gate_up_proj[j] [hidden, 2 * inter] (gate and up interleaved: columns
2i and 2i + 1) plus gate_up_proj_bias[j]; gate is clamped to at most
swiglu_limit and up to +-swiglu_limit; out = ((up + 1) * gate *
sigmoid(1.702 gate)) @ down_proj[j] + down_proj_bias[j]. At load the
experts are stacked as moe.py runs them: [E, 2 * inter, hidden] (gate rows
then up rows) and [E, hidden, inter], with their biases.

The published checkpoints store the experts as MXFP4 (quant_method
"mxfp4"): name_blocks U8 [E, out, in/32, 16] (two FP4 E2M1 values a byte,
the even one in the low nibble) and name_scales U8 [E, out, in/32] (E8M0:
2^(byte - 127) for each block of 32 inputs). They are dequantized at load
to the model's dtype (no MXFP4 kernel runs them); checkpoints with the
experts already dequantized (gate_up_proj, down_proj) load as they are.
"""
import torch
import torch.nn.functional as F

from ..errors import CheckpointError

# The FP4 E2M1 value of each 4-bit code (bit 3 the sign).
FP4 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCK = 32  # values sharing one MXFP4 scale
ALPHA = 1.702  # the sigmoid's slope in the experts' GLU


def load(get, ck, cfg, p, device, dtype):
    """The router and stacked experts (with biases) of layer prefix p."""
    m, h, inter, E = p + "mlp.", cfg.hidden, cfg.moe_intermediate, cfg.experts
    e = m + "experts."
    gu = _experts(get, ck, e + "gate_up_proj", (E, h, 2 * inter), device, dtype)  # [E, h, 2I], interleaved
    gub = get(e + "gate_up_proj_bias", (E, 2 * inter))
    down = _experts(get, ck, e + "down_proj", (E, inter, h), device, dtype)  # [E, I, h]
    return {
        "router": get(m + "router.weight", (E, h)), "router_b": get(m + "router.bias", (E,)),
        "experts_gu": torch.cat([gu[:, :, 0::2], gu[:, :, 1::2]], 2).transpose(1, 2).contiguous(),
        "experts_gu_b": torch.cat([gub[:, 0::2], gub[:, 1::2]], 1).contiguous(),
        "experts_down": down.transpose(1, 2).contiguous(),
        "experts_down_b": get(e + "down_proj_bias", (E, h)),
    }


def _experts(get, ck, name, shape, device, dtype):
    """Expert tensor name, [E, in, out]: dequantized from name_blocks and
    name_scales when the checkpoint has them, else as stored."""
    if not ck.has(name + "_blocks"):
        return get(name, shape)
    E, n_in, n_out = shape
    if n_in % BLOCK:
        raise CheckpointError(ck.file_of(name + "_blocks"), "MXFP4 needs inputs in blocks of %d, not %d" % (BLOCK, n_in),
                              name + "_blocks")
    G = n_in // BLOCK
    for suffix in ("_blocks", "_scales"):
        if ck.stored_dtype(name + suffix) != "U8":
            raise CheckpointError(ck.file_of(name + suffix), "dtype %s, want U8" % ck.stored_dtype(name + suffix), name + suffix)
    blocks = ck.raw(name + "_blocks", (E, n_out, G, BLOCK // 2), device)
    scales = ck.raw(name + "_scales", (E, n_out, G), device)
    if bool((scales == 255).any()):  # E8M0's NaN
        raise CheckpointError(ck.file_of(name + "_scales"), "holds a NaN scale (255)", name + "_scales")
    # One expert at a time: the float32 values of a whole tensor of
    # gpt-oss-120b would be gigabytes.
    w = torch.empty(E, n_in, n_out, device=device, dtype=dtype)
    for x in range(E):
        w[x] = dequantize(blocks[x : x + 1], scales[x : x + 1], dtype)[0]
    if not bool(torch.isfinite(w).all()):
        raise CheckpointError(ck.file_of(name + "_scales"), "scales overflow %s" % str(dtype).replace("torch.", ""),
                              name + "_scales")
    return w


def dequantize(blocks, scales, dtype):
    """MXFP4 blocks [E, out, G, 16] and scales [E, out, G] (uint8) to
    [E, G * 32, out] in dtype: the [E, in, out] layout of the
    dequantized checkpoints. Exact in float32 and bfloat16 (an FP4 value
    times a power of two) unless the power is beyond the dtype's range."""
    lut = torch.tensor(FP4, dtype=torch.float32, device=blocks.device)
    b = blocks.long()
    vals = torch.stack([lut[b & 15], lut[b >> 4]], dim=-1).flatten(-2)  # [E, out, G, 32]
    vals = torch.ldexp(vals, scales.to(torch.int32).unsqueeze(-1) - 127)
    E, n_out = blocks.shape[0], blocks.shape[1]
    return vals.reshape(E, n_out, -1).transpose(1, 2).to(dtype).contiguous()


def act_mul(gu, limit):
    """The experts' clamped GLU of packed [N, 2 * inter] rows (gate then
    up): (up + 1) * gate * sigmoid(1.702 gate), gate clamped to at most
    limit and up to +-limit."""
    g, u = gu.chunk(2, dim=-1)
    g = g.clamp(max=limit)
    u = u.clamp(min=-limit, max=limit)
    return (u + 1) * (g * torch.sigmoid(g * ALPHA))


def route(h, L, k):
    """(weights [N, k] in h's dtype, experts [N, k]): the top k of the
    router's logits and a softmax over those k."""
    logits = F.linear(h, L["router"], L["router_b"])
    top, idx = torch.topk(logits, k, dim=-1)
    return torch.softmax(top.float(), dim=-1).to(h.dtype), idx


def softmax_sinks(s, sinks):
    """softmax of scores s [..., L] with each row's sink logit (sinks,
    broadcast to s[..., :1]) as one more column, dropped after: in
    float32, s's rows summing to less than 1."""
    s = s.float()
    col = sinks.float().expand(*s.shape[:-1], 1)
    return torch.softmax(torch.cat([s, col], dim=-1), dim=-1)[..., :-1]


def with_sinks(o, lse, sinks):
    """Attention output o [..., H, hd] of a softmax without sinks, with
    lse [..., H] (float32) each row's log-sum-exp of its scaled scores
    (natural log), as the softmax with each head's sink logit (sinks [H],
    float32) gives it: each row scaled by exp(L) / (exp(L) + exp(s)) =
    sigmoid(L - s), in float32, then rounded to o's dtype (a second
    rounding, o having been rounded by the attention that made it, where
    the plain path rounds once). A row that saw no key (o zero, lse +inf
    as flash reports it or -inf) stays zero."""
    return (o.float() * torch.sigmoid(lse - sinks).unsqueeze(-1)).to(o.dtype)

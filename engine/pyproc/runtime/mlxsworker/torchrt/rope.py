"""Rotary embedding tables: the inverse frequencies of each rope_scaling
kind and the cos/sin rows the forward pass and the kernels index.

A table is [rows, head_dim]: row p holds cos (or sin) of position p over
the rotated dimensions (the first rot_dim of a head, as
cat(freqs, freqs)) and 1 (sin: 0) over the rest, so a partial rotation
(Phi-3's partial_rotary_factor) is the full formula x * cos +
rotate_half(x) * sin with the halves taken within rot_dim.
"""
import math

import torch

from ..errors import CheckpointError


def inv_freq(theta, dim, rs):
    """The inverse frequencies of a dim-wide rotation with base theta under
    rope_scaling rs (None, default, linear or llama3)."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    kind = (rs or {}).get("rope_type") or (rs or {}).get("type") or "default"
    if kind == "default":
        return inv
    try:
        if kind == "linear":
            factor = float(rs["factor"])
            if not factor > 0:
                raise ValueError("factor must be positive")
            return inv / factor
        if kind != "llama3":
            raise CheckpointError("config.json", "unsupported rope_scaling %r" % (kind,))
        factor, low, high = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old = float(rs["original_max_position_embeddings"])
        if not (factor > 0 and low > 0 and high > low and old > 0):
            raise ValueError("bad parameters")
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError("config.json", "rope_scaling %s: %s" % (kind, e))
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(medium, smoothed, scaled)


def is_longrope(rs):
    return bool(rs) and (rs.get("rope_type") or rs.get("type")) == "longrope"


def longrope(cfg):
    """Phi-3's longrope: (short inverse frequencies, long ones, the factor
    cos and sin are scaled by, the original context). inv_freq = 1 /
    (factor * base^(2i/d)); the attention factor is sqrt(1 + ln(s) /
    ln(original)) for s = max_position_embeddings / original > 1, unless
    rope_scaling gives attention_factor."""
    rs, dim = cfg.rope_scaling, cfg.rot_dim
    try:
        old = int(cfg.original_context or rs["original_max_position_embeddings"])
        short = torch.tensor([float(f) for f in rs["short_factor"]], dtype=torch.float32)
        long = torch.tensor([float(f) for f in rs["long_factor"]], dtype=torch.float32)
        if old <= 0 or short.numel() != dim // 2 or long.numel() != dim // 2:
            raise ValueError("want %d factors and a positive original context" % (dim // 2))
        base = cfg.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        grow = cfg.max_position / old
        att = rs.get("attention_factor")
        att = float(att) if att is not None else (1.0 if grow <= 1 else math.sqrt(1 + math.log(grow) / math.log(old)))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise CheckpointError("config.json", "rope_scaling longrope: %s" % e)
    return 1.0 / (short * base), 1.0 / (long * base), att, old


def table(inv, positions, head_dim, att=1.0):
    """(cos, sin) [len(positions), head_dim] in float32 for inverse
    frequencies inv (rot_dim / 2 of them)."""
    f = torch.outer(positions.float(), inv)
    emb = torch.cat([f, f], dim=-1)
    n, rot = emb.shape
    cos = torch.ones(n, head_dim)
    sin = torch.zeros(n, head_dim)
    cos[:, :rot] = emb.cos() * att
    sin[:, :rot] = emb.sin() * att
    return cos, sin


def tables(cfg, theta, rs):
    """The (cos, sin) rows of a layer kind, float32, and whether they are
    longrope's (rows past context hold the long factors' rotation of
    positions below the original context; see Decoder.rope_rows)."""
    ctx = cfg.context
    pos = torch.arange(ctx)
    if not is_longrope(rs):
        return table(inv_freq(theta, cfg.rot_dim, rs), pos, cfg.head_dim), False
    short, long, att, old = longrope(cfg)
    cs, ss = table(short, pos, cfg.head_dim, att)
    cl, sl = table(long, pos, cfg.head_dim, att)
    # rows [0, ctx): short below the original context, long from it on;
    # rows [ctx, ctx + original): long, for positions 0 .. original - 1.
    n = min(old, ctx)
    cos = torch.cat([cs[:n], cl[n:ctx], cl[:n]])
    sin = torch.cat([ss[:n], sl[n:ctx], sl[:n]])
    return (cos, sin), True

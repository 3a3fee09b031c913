"""Rotary embedding tables: the inverse frequencies of each rope_scaling
kind (default, linear, llama3, yarn, longrope) and the cos/sin rows the
forward pass and the kernels index. A kind's attention factor (yarn's,
longrope's) is in the rows, so whatever reads them needs nothing more.

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
    rope_scaling rs (None, default, linear or llama3; yarn is yarn's)."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    kind = scaling_kind(rs)
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


def scaling_kind(rs):
    """rope_scaling's type, as config.json spells it (rope_type or type)."""
    return (rs or {}).get("rope_type") or (rs or {}).get("type") or "default"


def yarn(cfg, theta, rs):
    """YaRN (arXiv 2309.00071) as transformers computes it: (inverse
    frequencies, the attention factor cos and sin are scaled by).

    Frequency i of the rot_dim-wide rotation keeps base^(-2i/d) while it
    turns more than beta_fast times over original_max_position_embeddings
    positions, is divided by factor below beta_slow turns, and blends the
    two linearly by index in between (the bounds floored and ceiled to
    whole indices unless truncate is false). The attention factor is
    attention_factor, else get_mscale(factor, mscale) /
    get_mscale(factor, mscale_all_dim) when both are set, else
    get_mscale(factor) = 0.1 ln(factor) + 1."""
    dim = cfg.rot_dim
    try:
        factor = _num(rs, "factor", None)
        if not factor >= 1:
            raise ValueError("factor %r must be at least 1" % factor)
        old = _num(rs, "original_max_position_embeddings", cfg.max_position)
        if not old > 0:
            raise ValueError("original_max_position_embeddings %r must be positive" % old)
        fast, slow = _num(rs, "beta_fast", 32.0) or 32.0, _num(rs, "beta_slow", 1.0) or 1.0
        if not 0 < slow <= fast:
            raise ValueError("beta_fast %r and beta_slow %r: want 0 < beta_slow <= beta_fast" % (fast, slow))
        truncate = rs.get("truncate", True)
        if not isinstance(truncate, bool):
            raise ValueError("truncate %r: want true or false" % (truncate,))
        att = _attention_factor(rs, factor)
    except (TypeError, ValueError) as e:
        raise CheckpointError("config.json", "rope_scaling yarn: %s" % e)

    def bound(turns):  # the index whose frequency turns `turns` times over old positions
        return dim * math.log(old / (turns * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = bound(fast), bound(slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    powers = theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
    keep = 1 - ramp  # the share of each frequency left unscaled
    return (1.0 / (factor * powers)) * (1 - keep) + (1.0 / powers) * keep, att


def _num(rs, key, default):
    """rope_scaling's number key (default when absent or null)."""
    v = rs.get(key)
    if v is None:
        if default is None:
            raise ValueError("missing %s" % key)
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError("%s %r: want a number" % (key, v))
    return float(v)


def _attention_factor(rs, factor):
    def mscale(m):
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    att = rs.get("attention_factor")
    if att is not None:
        att = _num(rs, "attention_factor", None)
    else:
        m, mall = _num(rs, "mscale", 0.0), _num(rs, "mscale_all_dim", 0.0)
        att = mscale(m) / mscale(mall) if m and mall else mscale(1.0)
    if not att > 0:
        raise ValueError("attention factor %r (attention_factor, mscale, mscale_all_dim) must be positive" % att)
    return att


def is_longrope(rs):
    return scaling_kind(rs) == "longrope"


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
    if scaling_kind(rs) == "yarn":
        inv, att = yarn(cfg, theta, rs)
        return table(inv, pos, cfg.head_dim, att), False
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

"""Triton kernels for the CUDA decode path.

Imported only where torch runs on CUDA and Triton imports (torch's CUDA
wheels ship it); everywhere else the forward pass keeps its plain torch
code. Each kernel reproduces the rounding of the torch code it replaces
(bfloat16/float16 results rounded where torch rounds them), so greedy
tokens do not depend on which path ran.

- add_rms: the residual add and the next RMSNorm in one pass (in decode
  steps of a mixture, its k choices summed first).
- silu_mul: SwiGLU's silu(gate) * up from the packed gate_up projection.
  Both also write their output's e4m3 codes and scales where the next
  product is an FP8 one that would quantize it first (quant=ACT_GROUP:
  quant_triton.give), one launch fewer a product.
- decode_attention: one token per sequence: the per-head RMS norms of q
  and k where the family has them (qwen3, gemma3), rotary embedding of q and k,
  the new k and v written into the sequence's KV block, and attention
  over its blocks read through the block table (paged.py), all heads of a
  KV group in one program; no gather of the cache, no mask, any length up
  to the context. A learned sink logit per head (gpt_oss) adds exp(s_h -
  m) to the softmax's final denominator (in the combine where the cache is
  split).
- rope_kv: the rotary embedding of a prompt chunk's q and k and its KV
  write into the blocks.
- prompt_attention: causal attention of a step's prompt chunks over their
  blocks through the block table (flash-style tiles of a chunk's tokens
  times a KV head's query heads), whose only host input is a small tile
  plan: the prompt-step graphs (prefill.py) hold it whole.

The decode path's kernels (add_rms, silu_mul, decode_attention and its
combine) launch under programmatic dependent launch on sm_90 and later
(pdl.py): each waits for its predecessor first, then lets its successor
launch.

A pool of torch.float8_e4m3fn (FP8 KV, kvcache.py) is written as e4m3(x /
scale) and read as code * scale, converted in registers: the attention
walks one byte an element and never a bf16 copy of the pool. The current
token's k and v are used as a read of the pool would give them.
"""
import math
import os

import torch
import triton
import triton.language as tl

from . import kvcache, pdl, quant_triton
from .kvcache import FLOAT8
from .pdl import release as pdl_release, wait as pdl_wait
from .quant_triton import e4m3_groups, silu_times


@triton.jit
def _normed(x, rstd, w, ROUND: tl.constexpr, OFFSET: tl.constexpr):
    # x times its row's rstd and the norm's weight w, rounded as
    # decoder.rms rounds the norm kind (NORMS), in x's dtype.
    w = w.to(tl.float32)
    if OFFSET:  # Gemma: (1 + w)
        w = w + 1.0
    if ROUND:  # Llama: the normalised rows rounded to x's dtype before w
        y = (x.to(tl.float32) * rstd).to(x.dtype).to(tl.float32) * w
    else:  # OLMo 2, Gemma: one rounding at the end
        y = x.to(tl.float32) * rstd * w
    return y.to(x.dtype)


@triton.jit
def _quant_out(y, q_ptr, s_ptr, row, n, ssm, ssg, g0, BLOCK: tl.constexpr, GROUP: tl.constexpr):
    # The e4m3 codes and scales of y, a [BLOCK] piece of a row from
    # group g0 on, as quant_triton.act_quant writes them (the same
    # arithmetic: quant_triton.e4m3_groups); groups past n are masked.
    GROUPS: tl.constexpr = BLOCK // GROUP
    g = tl.arange(0, GROUPS)
    offs = (g0 + g)[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    q, s = e4m3_groups(tl.reshape(y.to(tl.float32), (GROUPS, GROUP)))
    tl.store(q_ptr + row * n + offs, q.to(q_ptr.dtype.element_ty), mask=offs < n)
    tl.store(s_ptr + row * ssm + (g0 + g) * ssg, s, mask=(g0 + g) * GROUP < n)


# Not specialized on the scales' strides (one is the step's rows), so a
# model compiles one variant of each kind (as quant_triton's).
@triton.jit(do_not_specialize=["ssm", "ssg"])
def _add_rms_kernel(x_ptr, d_ptr, w_ptr, xo_ptr, y_ptr, q_ptr, s_ptr, ssm, ssg, n, eps, HAS_D: tl.constexpr,
                    KS: tl.constexpr, BLOCK: tl.constexpr, ROUND: tl.constexpr, OFFSET: tl.constexpr,
                    QUANT: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    pdl_release(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + row * n + offs, mask=m, other=0.0)
    if HAS_D:
        if KS == 1:
            d = tl.load(d_ptr + row * n + offs, mask=m, other=0.0).to(tl.float32)
        else:  # a mixture's k choices, summed in float32 and rounded once, as torch's sum over them
            d = tl.zeros([BLOCK], tl.float32)
            for j in tl.static_range(KS):
                d += tl.load(d_ptr + (row * KS + j) * n + offs, mask=m, other=0.0).to(tl.float32)
            d = d.to(x.dtype).to(tl.float32)
        x = (x.to(tl.float32) + d).to(x.dtype)
        tl.store(xo_ptr + row * n + offs, x, mask=m)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n + eps)
    y = _normed(x, rstd, tl.load(w_ptr + offs, mask=m, other=0.0), ROUND, OFFSET)
    tl.store(y_ptr + row * n + offs, y, mask=m)
    if QUANT:
        _quant_out(y, q_ptr, s_ptr, row, n, ssm, ssg, 0, BLOCK, QUANT)


# The RMSNorm kinds (decoder.Decoder.rms): (round before w, 1 + w).
NORMS = {"llama": (True, False), "olmo2": (False, False), "gemma": (False, True)}


def add_rms(x, d, w, eps, norm="llama", quant=0):
    """Returns (x + d, rms_norm(x + d) * w); with d None, (x, rms_norm(x) * w).
    x: contiguous [N, hidden]; d: contiguous [N, hidden], or [N, k, hidden]
    (a mixture's k choices, unsummed: moe.Experts.forward(summed=False)),
    summed first; norm: the kind (NORMS). quant: quant_triton.ACT_GROUP
    (hidden a multiple of it) also returns the normalised rows' e4m3
    codes and scales for fp8_mma, as act_quant computes them: (x + d,
    rows, codes, scales)."""
    rnd, off = NORMS[norm]
    n = x.shape[-1]
    y = torch.empty_like(x)
    xo = torch.empty_like(x) if d is not None else x
    ks = d.shape[1] if d is not None and d.dim() == 3 else 1
    q, s = _codes(x.shape[0], n, x.device, quant)
    if x.shape[0]:
        _add_rms_kernel[(x.shape[0],)](x, d if d is not None else x, w, xo, y, q, s, *s.stride(), n, eps,
                                       HAS_D=d is not None, KS=ks, BLOCK=triton.next_power_of_2(n), ROUND=rnd, OFFSET=off,
                                       QUANT=quant, num_warps=8, **pdl.args(x.device, x.shape[0]))
    return (xo, y, q, s) if quant else (xo, y)


def _codes(rows, n, device, quant):
    """The codes and scales a kernel quantizing its [rows, n] output for
    fp8_mma writes (quant: the group; 0: none, placeholders)."""
    if quant:
        assert n % quant == 0 and quant == quant_triton.ACT_GROUP, (n, quant)
        return quant_triton.quantized_codes(rows, n, device)
    return _unused(device), _unused(device).view(1, 1)


_none = {}


def _unused(device):
    """A placeholder tensor for pointers a kernel does not read (QUANT 0)."""
    if device not in _none:
        _none[device] = torch.zeros(1, dtype=torch.float32, device=device)
    return _none[device]


@triton.jit(do_not_specialize=["ssm", "ssg"])
def _silu_mul_kernel(gu_ptr, out_ptr, q_ptr, s_ptr, ssm, ssg, inter, BLOCK: tl.constexpr, QUANT: tl.constexpr,
                     PDL: tl.constexpr):
    pdl_wait(PDL)
    pdl_release(PDL)
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < inter
    g = tl.load(gu_ptr + row * 2 * inter + offs, mask=m, other=0.0)
    u = tl.load(gu_ptr + row * 2 * inter + inter + offs, mask=m, other=0.0)
    y = silu_times(g, u)
    tl.store(out_ptr + row * inter + offs, y, mask=m)
    if QUANT:  # BLOCK a multiple of the group: whole groups a program
        _quant_out(y, q_ptr, s_ptr, row, inter, ssm, ssg, tl.program_id(1) * (BLOCK // QUANT), BLOCK, QUANT)


def silu_mul(gu, quant=0):
    """gu: contiguous [N, 2*inter] (gate then up). Returns silu(gate) * up;
    quant: as add_rms's, (rows, codes, scales)."""
    n, inter = gu.shape[0], gu.shape[1] // 2
    out = torch.empty(n, inter, device=gu.device, dtype=gu.dtype)
    BLOCK = 1024
    q, s = _codes(n, inter, gu.device, quant)
    if n:
        _silu_mul_kernel[(n, triton.cdiv(inter, BLOCK))](gu, out, q, s, *s.stride(), inter, BLOCK=BLOCK, QUANT=quant,
                                                          num_warps=4, **pdl.args(gu.device, n))
    return (out, q, s) if quant else out


@triton.jit
def _partner(HD: tl.constexpr, ROT: tl.constexpr):
    # The dimension each one rotates with: (d + ROT/2) % ROT within the
    # first ROT, itself past them (the tables hold cos 1 and sin 0 there).
    d = tl.arange(0, HD)
    return tl.where(d < ROT, (d + ROT // 2) % ROT, d)


@triton.jit
def _rope(x, xr, cos, sin, HALF: tl.constexpr, HD: tl.constexpr):
    # x * cos + rotate_half(x) * sin, rounded like torch: each product and
    # the sum in x's dtype. xr is x loaded at _partner(HD, 2 * HALF); HALF
    # is half the rotated dims.
    d = tl.arange(0, HD)
    sign = tl.where(d < HALF, -1.0, 1.0)
    a = (x.to(tl.float32) * cos.to(tl.float32)).to(x.dtype)
    b = ((xr.to(tl.float32) * sign) * sin.to(tl.float32)).to(x.dtype)
    return (a.to(tl.float32) + b.to(tl.float32)).to(x.dtype)


@triton.jit
def _e4m3_grid(y):
    # y (float32, |y| <= 448) rounded to the nearest e4m3 value, ties to
    # even, its sign kept, in float32. The conversion to float8 after it is
    # exact whichever way the compiler takes (before sm_90 through float16,
    # which would round twice).
    bits = y.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)  # the binade; e4m3's subnormals share the lowest one's step
    step = ((e + 124) << 23).to(tl.float32, bitcast=True)  # 2^(e - 3): three mantissa bits
    inv = ((130 - e) << 23).to(tl.float32, bitcast=True)  # 1 / step
    # Adding 1.5 * 2^23 rounds a float32 below 2^22 to an integer, ties to even.
    r = ((tl.abs(y) * inv + 12582912.0) - 12582912.0) * step
    return tl.where(bits < 0, -r, r)


@triton.jit
def _kv_encode(x, inv, FP8: tl.constexpr):
    # x as the pool stores it: with FP8, e4m3(x * inv), inv the float32
    # reciprocal of the scale, saturating at ±448, round to nearest even:
    # the bytes kvcache.KVFormat.encode gives.
    y = x
    if FP8:
        y = tl.minimum(tl.maximum(x.to(tl.float32) * inv, -448.0), 448.0)
        y = _e4m3_grid(y).to(tl.float8e4nv)
    return y


@triton.jit
def _kv_decode(c, scale, like, FP8: tl.constexpr):
    # Stored values in like's dtype: with FP8, code * scale in float32,
    # rounded once (kvcache.KVFormat.decode).
    y = c
    if FP8:
        y = (c.to(tl.float32) * scale).to(like.dtype)
    return y


@triton.jit
def _decode_attn_kernel(qkv_ptr, kc_ptr, vc_ptr, out_ptr, part_ptr, ml_ptr, bt_ptr, row_ptr, pos_ptr, cos_ptr, sin_ptr,
                        sink_ptr, qn_ptr, kn_ptr, qkv_stride, bt_stride, s_blk, s_pos, s_head, scale, k_scale, v_scale, k_inv,
                        v_inv, eps,
                        H: tl.constexpr, K: tl.constexpr, REP: tl.constexpr, RB: tl.constexpr,
                        HD: tl.constexpr, BS: tl.constexpr, BLOCK: tl.constexpr, SPLIT: tl.constexpr, IEEE: tl.constexpr,
                        PREFETCH: tl.constexpr, ROT: tl.constexpr, WINDOW: tl.constexpr, FP8: tl.constexpr,
                        SINK: tl.constexpr, QKN: tl.constexpr, NROUND: tl.constexpr, NOFFSET: tl.constexpr,
                        EARLY: tl.constexpr, PDL: tl.constexpr):
    if not EARLY:
        pdl_wait(PDL)
        pdl_release(PDL)
    b = tl.program_id(0)
    kh = tl.program_id(1)
    sp = tl.program_id(2)
    # EARLY: the step's inputs (table row, position, rotary rows, the first
    # tile's block ids) load before the wait, while the qkv product ends.
    # The caller vouches that the launch just before did not write them
    # (decode_attention's early), and every launch before that one has
    # completed by now (pdl.py: each releases after its wait).
    bt = bt_ptr + tl.load(row_ptr + b).to(tl.int64) * bt_stride  # the sequence's block table
    p = tl.load(pos_ptr + b)
    d = tl.arange(0, HD)
    dr = _partner(HD, ROT)
    r = tl.arange(0, RB)
    rm = r < REP
    row = qkv_ptr + b * qkv_stride
    cos = tl.load(cos_ptr + p * HD + d)
    sin = tl.load(sin_ptr + p * HD + d)
    # This program's share of the cached positions [first, p): first is 0,
    # or p - WINDOW + 1 in a sliding layer (keys p - WINDOW < j <= p).
    first = p * 0
    if WINDOW > 0:
        first = tl.maximum(p - (WINDOW - 1), p * 0)
    chunk = tl.cdiv(tl.cdiv(p - first, SPLIT), BLOCK) * BLOCK
    lo = first + sp * chunk
    hi = tl.minimum(p, lo + chunk)
    j = tl.arange(0, BLOCK)
    nxt = tl.load(bt + (lo + j) // BS, mask=lo + j < hi, other=0)
    if EARLY:
        pdl_wait(PDL)
        pdl_release(PDL)
    qh = (kh * REP + r)[:, None] * HD
    q = tl.load(row + qh + d[None, :], mask=rm[:, None], other=0.0)
    qr = tl.load(row + qh + dr[None, :], mask=rm[:, None], other=0.0)
    k = tl.load(row + (H + kh) * HD + d)
    kr = tl.load(row + (H + kh) * HD + dr)
    if QKN:  # each head of q and k RMS-normalised first (decoder.qk_norm)
        qf = q.to(tl.float32)
        qs = (1.0 / tl.sqrt(tl.sum(qf * qf, axis=1) / HD + eps))[:, None]
        q = _normed(q, qs, tl.load(qn_ptr + d)[None, :], NROUND, NOFFSET)
        qr = _normed(qr, qs, tl.load(qn_ptr + dr)[None, :], NROUND, NOFFSET)
        kf = k.to(tl.float32)
        ks = 1.0 / tl.sqrt(tl.sum(kf * kf, axis=0) / HD + eps)
        k = _normed(k, ks, tl.load(kn_ptr + d), NROUND, NOFFSET)
        kr = _normed(kr, ks, tl.load(kn_ptr + dr), NROUND, NOFFSET)
    q = _rope(q, qr, cos[None, :], sin[None, :], ROT // 2, HD)
    k = _rope(k, kr, cos, sin, ROT // 2, HD)
    v = tl.load(row + (H + K + kh) * HD + d)
    if sp == 0:
        at = tl.load(bt + p // BS).to(tl.int64) * s_blk + (p % BS) * s_pos + kh * s_head
        k8 = _kv_encode(k, k_inv, FP8)
        v8 = _kv_encode(v, v_inv, FP8)
        tl.store(kc_ptr + at + d, k8)
        tl.store(vc_ptr + at + d, v8)
        k = _kv_decode(k8, k_scale, k, FP8)
        v = _kv_decode(v8, v_scale, v, FP8)
        # The current token from registers; the cache for positions before p.
        m_i = tl.sum(q.to(tl.float32) * k.to(tl.float32)[None, :], axis=1) * scale
        l_i = tl.full([RB], 1.0, tl.float32)
        acc = tl.zeros([RB, HD], tl.float32) + v.to(tl.float32)[None, :]
    else:
        m_i = tl.full([RB], float("-inf"), tl.float32)
        l_i = tl.zeros([RB], tl.float32)
        acc = tl.zeros([RB, HD], tl.float32)
    for start in range(lo, hi, BLOCK):
        pj = start + j
        jm = pj < hi
        if PREFETCH:  # this tile's blocks came with the last one; load the next tile's now
            blk = nxt.to(tl.int64)
            nxt = tl.load(bt + (pj + BLOCK) // BS, mask=pj + BLOCK < hi, other=0)
        else:
            blk = tl.load(bt + pj // BS, mask=jm, other=0).to(tl.int64)
        off = blk * s_blk + (pj % BS) * s_pos + kh * s_head
        kb = _kv_decode(tl.load(kc_ptr + off[:, None] + d[None, :], mask=jm[:, None], other=0.0), k_scale, q, FP8)
        vb = _kv_decode(tl.load(vc_ptr + off[:, None] + d[None, :], mask=jm[:, None], other=0.0), v_scale, q, FP8)
        if IEEE:
            s = tl.dot(q, tl.trans(kb), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(kb))
        s = tl.where(jm[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        pr = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(pr, axis=1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(pr, vb.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(pr.to(vb.dtype), vb)
        m_i = m_new
    if SPLIT == 1:
        if SINK:  # m_i is finite: the current token is always seen
            l_i += tl.exp(tl.load(sink_ptr + kh * REP + r, mask=rm, other=0.0) - m_i)
        o = acc / l_i[:, None]
        tl.store(out_ptr + b * (H * HD) + qh + d[None, :], o.to(v.dtype), mask=rm[:, None])
    else:
        # Partial results for _combine_kernel: acc [B, K, SPLIT, RB, HD], (m, l) [B, K, SPLIT, 2, RB].
        at = (b * K + kh) * SPLIT + sp
        tl.store(part_ptr + at * RB * HD + r[:, None] * HD + d[None, :], acc)
        tl.store(ml_ptr + at * 2 * RB + r, m_i)
        tl.store(ml_ptr + at * 2 * RB + RB + r, l_i)


@triton.jit
def _combine_kernel(part_ptr, ml_ptr, out_ptr, sink_ptr, H: tl.constexpr, K: tl.constexpr, REP: tl.constexpr,
                    RB: tl.constexpr, HD: tl.constexpr, SPLIT: tl.constexpr, SINK: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    pdl_release(PDL)
    b = tl.program_id(0)
    kh = tl.program_id(1)
    r = tl.arange(0, RB)
    d = tl.arange(0, HD)
    s = tl.arange(0, SPLIT)
    at = (b * K + kh) * SPLIT + s
    m = tl.load(ml_ptr + at[:, None] * 2 * RB + r[None, :])  # [SPLIT, RB]
    l = tl.load(ml_ptr + at[:, None] * 2 * RB + RB + r[None, :])
    mx = tl.max(m, axis=0)
    w = tl.exp(m - mx[None, :])  # empty splits: exp(-inf) = 0
    lt = tl.sum(l * w, axis=0)
    rm = r < REP
    if SINK:  # mx is finite: split 0 holds the current token
        lt += tl.exp(tl.load(sink_ptr + kh * REP + r, mask=rm, other=0.0) - mx)
    o = tl.zeros([RB, HD], tl.float32)
    for i in tl.static_range(SPLIT):
        wi = tl.sum(tl.where(s[:, None] == i, w, 0.0), axis=0)
        acc = tl.load(part_ptr + ((b * K + kh) * SPLIT + i) * RB * HD + r[:, None] * HD + d[None, :])
        o += acc * wi[:, None]
    o = o / lt[:, None]
    tl.store(out_ptr + b * (H * HD) + (kh * REP + r)[:, None] * HD + d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=rm[:, None])


@triton.jit
def _rope_kv_kernel(qkv_ptr, qk_ptr, kc_ptr, vc_ptr, kvrow_ptr, pos_ptr, cos_ptr, sin_ptr,
                    qkv_stride, s_pos, s_head, k_inv, v_inv,
                    H: tl.constexpr, K: tl.constexpr, NB: tl.constexpr, HD: tl.constexpr, ROT: tl.constexpr,
                    FP8: tl.constexpr):
    row = tl.program_id(0)
    kvrow = tl.load(kvrow_ptr + row)
    p = tl.load(pos_ptr + row)
    h = tl.arange(0, NB)  # q heads, then k heads, then v heads
    d = tl.arange(0, HD)
    dr = _partner(HD, ROT)
    hm = h < H + 2 * K
    src = qkv_ptr + row * qkv_stride + h[:, None] * HD
    x = tl.load(src + d[None, :], mask=hm[:, None], other=0.0)
    xr = tl.load(src + dr[None, :], mask=hm[:, None], other=0.0)
    cos = tl.load(cos_ptr + p * HD + d)
    sin = tl.load(sin_ptr + p * HD + d)
    r = _rope(x, xr, cos[None, :], sin[None, :], ROT // 2, HD)
    isqk = h < H + K
    tl.store(qk_ptr + row * (H + K) * HD + h[:, None] * HD + d[None, :], r, mask=isqk[:, None])
    at = kvrow.to(tl.int64) * s_pos + d[None, :]
    tl.store(kc_ptr + at + (h - H)[:, None] * s_head, _kv_encode(r, k_inv, FP8), mask=((h >= H) & isqk)[:, None])
    tl.store(vc_ptr + at + (h - H - K)[:, None] * s_head, _kv_encode(x, v_inv, FP8), mask=((h >= H + K) & hm)[:, None])


def rope_kv(qkv, kc, vc, kvrow, pos, cos, sin, heads, kv_heads, rot=None, k_scale=1.0, v_scale=1.0):
    """Any number of tokens: qkv [N, (H + 2K) * hd], kvrow and pos [N]
    (int64) per token: its row in the flattened blocks (block *
    block_size + offset) and its row of the cos and sin tables (its
    position, or decoder.rope_rows' row). kc, vc: [blocks, block_size, K,
    hd] (float8_e4m3fn: written with k_scale and v_scale). rot: the
    rotated dims of a head (None: all). Writes the rotated k and v into
    the blocks and returns the rotated q and k (not rounded), [N, H + K,
    hd]."""
    N = qkv.shape[0]
    hd = kc.shape[-1]
    rot = rot or hd
    qk = torch.empty(N, heads + kv_heads, hd, device=qkv.device, dtype=qkv.dtype)
    if N:
        _rope_kv_kernel[(N,)](qkv, qk, kc, vc, kvrow, pos, cos, sin,
                              qkv.stride(0), kc.stride(1), kc.stride(2), 1.0 / k_scale, 1.0 / v_scale,
                              H=heads, K=kv_heads, NB=triton.next_power_of_2(heads + 2 * kv_heads), HD=hd, ROT=rot,
                              FP8=kc.dtype == FLOAT8, num_warps=4)
    return qk


# The shortest context whose cache splits up to 16 ways; shorter ones
# split up to SHORT_SPLITS ways (MLXSERVING_ATTN_SHORT_SPLITS in the
# worker's environment: measurement; 1 splits none).
SPLIT_FROM = 4096
SHORT_SPLITS = int(os.environ.get("MLXSERVING_ATTN_SHORT_SPLITS", "4"))


def splits(batch, kv_heads, context):
    """How many programs share one sequence's cache. A long context splits
    up to 16 ways while the programs stay within a wave. A short one
    splits less: a cache of a few tiles gains from 2 to 4 programs (8B
    shape on an H200, caches of 128 to 255 positions, the combine
    included: 7.90 us at one, 5.47 at four, 7.96 at sixteen at batch 1;
    8.07, 6.61 and 6.53 us at one, two and four at batch 8), and up to
    256 programs in all."""
    n = 1
    if context >= SPLIT_FROM:
        while n < 16 and batch * kv_heads * n * 2 <= 256:
            n *= 2
        return n
    while n < SHORT_SPLITS and batch * kv_heads * n < 256:
        n *= 2
    return n


# Launch parameters of _decode_attn_kernel, (block, warps, stages), chosen
# by batch size from cmd/gpubench/attn_tune.py on an H100; ATTN_CONFIG
# set overrides them (the tuning script does).
ATTN_CONFIG = None

# The decode attention's step inputs load before its PDL wait
# (_decode_attn_kernel's EARLY), where the caller says they are the step's
# inputs (decode_attention's early) and it launches ON (pdl.py: up to
# pdl.ON_ROWS rows, where it was measured: 8B shape on an H200, batch 1,
# FP8 1.010x, bf16 1.006x); MLXSERVING_ATTN_EARLY=0 in the worker's
# environment loads them after it (measurement).
ATTN_EARLY = os.environ.get("MLXSERVING_ATTN_EARLY", "") != "0"


# The shared memory a launch's pipelined K and V tiles may take: below the
# 227 KB an H100/H200 block gets, with room for the kernel's own.
ATTN_SMEM = 200 * 1024


def _attn_config(batch, hd, elem):
    """(block, warps, stages) for a batch of batch sequences over a pool of
    head dim hd and elem bytes an element: the tuned pair, with fewer
    stages and then smaller blocks where the K and V tiles would not fit
    (float32 pools of 256-wide heads)."""
    if ATTN_CONFIG is not None:
        return ATTN_CONFIG
    block, warps, stages = (32, 1, 3) if batch >= 32 else (64, 4, 3)
    while stages * 2 * block * hd * elem > ATTN_SMEM and (stages > 2 or block > 16):
        if stages > 2:
            stages -= 1
        else:
            block //= 2
    return block, warps, stages


def decode_attention(qkv, kc, vc, table, rows, pos, cos, sin, heads, kv_heads, context, scale=None, window=0, rot=None,
                     prefetch=True, k_scale=1.0, v_scale=1.0, sinks=None, qk_norm=None, early=False):
    """qkv [B, (H + 2K) * hd] (q, k, v projections of one token per
    sequence, before the rotary embedding); kc, vc [blocks, block_size, K,
    hd]; table [rows, max_blocks] (int32): each sequence's blocks; rows,
    pos [B] (int64): the sequence's table row and the token's position;
    context: the longest a sequence gets (how the cache is split); scale:
    of q.k (None: 1/sqrt(hd)); window: a sliding window (0: none); rot:
    the rotated dims of a head (None: all); prefetch: each tile of the
    loop loads the next tile's block ids, one tile ahead of the cache
    loads that depend on them (settings.attn_prefetch); k_scale, v_scale:
    the layer's KV scales where kc and vc are float8_e4m3fn; sinks: each
    head's sink logit, [H] float32 contiguous (gpt_oss; None: none), one
    more column of the softmax that holds no value; qk_norm: (q weight,
    k weight [hd], eps, norm kind) to RMS-normalise each head of q and k
    before the rotary embedding, as decoder.qk_norm does (None: qkv comes
    normalised or the family has no such norm); early: table, rows and pos
    are the step's inputs, written before the launch before this one, so
    the kernel may load them before its PDL wait (ATTN_EARLY). Writes k
    and v at pos and returns attention over positions 0..pos (pos - window
    < j <= pos in a sliding layer), [B, H * hd]."""
    B = qkv.shape[0]
    hd = kc.shape[-1]
    rot = rot or hd
    if scale is None:
        scale = 1.0 / math.sqrt(hd)
    if window:
        context = min(context, window)  # the keys a token sees
    bs = kc.shape[1]
    rep = heads // kv_heads
    rb = max(16, triton.next_power_of_2(rep))
    out = torch.empty(B, heads * hd, device=qkv.device, dtype=qkv.dtype)
    sp = splits(B, kv_heads, context)
    block, warps, stages = _attn_config(B, hd, kc.element_size())
    part = ml = out
    if sp > 1:
        part = torch.empty(B * kv_heads * sp * rb * hd, device=qkv.device, dtype=torch.float32)
        ml = torch.empty(B * kv_heads * sp * 2 * rb, device=qkv.device, dtype=torch.float32)
    sink = out if sinks is None else sinks  # out: an unread pointer
    qn, kn, eps, nkind = qk_norm if qk_norm is not None else (out, out, 0.0, "llama")
    nround, noff = NORMS[nkind]
    launch = pdl.args(qkv.device, B)
    _decode_attn_kernel[(B, kv_heads, sp)](
        qkv, kc, vc, out, part, ml, table, rows, pos, cos, sin, sink, qn, kn,
        qkv.stride(0), table.stride(0), kc.stride(0), kc.stride(1), kc.stride(2), scale, float(k_scale), float(v_scale),
        1.0 / k_scale, 1.0 / v_scale, float(eps),
        H=heads, K=kv_heads, REP=rep, RB=rb, HD=hd, BS=bs, BLOCK=block, SPLIT=sp,
        IEEE=qkv.dtype == torch.float32, PREFETCH=prefetch, ROT=rot, WINDOW=window, FP8=kc.dtype == FLOAT8,
        SINK=sinks is not None, QKN=qk_norm is not None, NROUND=nround, NOFFSET=noff,
        EARLY=early and ATTN_EARLY and launch["PDL"] == pdl.ON, num_warps=warps, num_stages=stages, **launch)
    if sp > 1:
        _combine_kernel[(B, kv_heads)](part, ml, out, sink, H=heads, K=kv_heads, REP=rep, RB=rb, HD=hd, SPLIT=sp,
                                       SINK=sinks is not None, num_warps=4, **launch)
    return out


# Launch parameters of prompt_attention, (keys a loop step where masks
# apply, keys a step where none do, warps, stages) by head dim; PROMPT_CONFIG set overrides them (the tuning runs
# of testdata/prompt_attention_test.py --bench do).
PROMPT_CONFIG = None
LOG2E = 1.4426950408889634


@triton.jit
def _prompt_keys(q, acc, m_i, l_i, start, hi, qpos, bt, kc_ptr, vc_ptr, off_h, s_blk, s_pos, scale2, k_scale, v_scale,
                 d, j, BS: tl.constexpr, WINDOW: tl.constexpr, FP8: tl.constexpr, IEEE: tl.constexpr,
                 MASK: tl.constexpr):
    # One step of keys start .. start + BN - 1 of the online softmax (in
    # base 2: scale2 is the scale times log2 e). MASK: some key of the
    # step is past hi, past a query's position or out of its window;
    # without it every query of the tile sees every key of the step.
    pj = start + j
    if MASK:
        jm = pj < hi
        blk = tl.load(bt + pj // BS, mask=jm, other=0).to(tl.int64)
        off = blk * s_blk + (pj % BS) * s_pos + off_h
        kb = _kv_decode(tl.load(kc_ptr + off[:, None] + d[None, :], mask=jm[:, None], other=0.0), k_scale, q, FP8)
        vb = _kv_decode(tl.load(vc_ptr + off[:, None] + d[None, :], mask=jm[:, None], other=0.0), v_scale, q, FP8)
    else:
        blk = tl.load(bt + pj // BS).to(tl.int64)
        off = blk * s_blk + (pj % BS) * s_pos + off_h
        kb = _kv_decode(tl.load(kc_ptr + off[:, None] + d[None, :]), k_scale, q, FP8)
        vb = _kv_decode(tl.load(vc_ptr + off[:, None] + d[None, :]), v_scale, q, FP8)
    if IEEE:
        s = tl.dot(q, tl.trans(kb), input_precision="ieee") * scale2
    else:
        s = tl.dot(q, tl.trans(kb)) * scale2
    if MASK:
        ok = jm[None, :] & (pj[None, :] <= qpos[:, None])
        if WINDOW > 0:
            ok = ok & (pj[None, :] > qpos[:, None] - WINDOW)
        s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_use = m_new
    if MASK:  # a row that has seen no key yet (a sliding window's edge): 0, not -inf - -inf
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    pr = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(pr, axis=1)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(pr, vb.to(tl.float32), input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(pr.to(vb.dtype), vb)
    return acc, m_new, l_i


@triton.jit
def _prompt_attn_kernel(q_ptr, kc_ptr, vc_ptr, out_ptr, bt_ptr, tile_ptr, q_stride, bt_stride, s_blk, s_pos, s_head,
                        tile_stride, scale2, k_scale, v_scale,
                        H: tl.constexpr, REP: tl.constexpr, REPP: tl.constexpr, ROWS: tl.constexpr, HD: tl.constexpr,
                        BS: tl.constexpr, BN: tl.constexpr, BNF: tl.constexpr, WINDOW: tl.constexpr, FP8: tl.constexpr,
                        IEEE: tl.constexpr):
    # The KV heads vary fastest across programs, so every head's first
    # tiles (tile_plan: the longest) start first.
    kh = tl.program_id(0)
    t = tl.program_id(1)
    n = tl.load(tile_ptr + tile_stride + t)  # the tile's tokens; 0: an unused program
    if n > 0:
        a = tl.load(tile_ptr + t)  # its first packed row
        p0 = tl.load(tile_ptr + 2 * tile_stride + t)  # that row's position
        trow = tl.load(tile_ptr + 3 * tile_stride + t)  # the sequence's block-table row
        m = tl.arange(0, ROWS)  # tokens of the tile times the KV head's query heads
        tok = m // REPP
        r = m % REPP
        rm = (tok < n) & (r < REP)
        d = tl.arange(0, HD)
        head = (kh * REP + r) * HD
        q = tl.load(q_ptr + (a + tok).to(tl.int64)[:, None] * q_stride + head[:, None] + d[None, :], mask=rm[:, None],
                    other=0.0)
        qpos = p0 + tok
        bt = bt_ptr + trow.to(tl.int64) * bt_stride
        off_h = kh * s_head
        hi = p0 + n  # keys 0 .. the tile's last position
        m_i = tl.full([ROWS], float("-inf"), tl.float32)
        l_i = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, HD], tl.float32)
        j = tl.arange(0, BN)
        lo = p0 * 0
        if WINDOW > 0:  # no query of the tile sees a key at or before p0 - WINDOW
            lo = tl.maximum(p0 - (WINDOW - 1), lo)
            for start in range(lo, hi, BN):
                acc, m_i, l_i = _prompt_keys(q, acc, m_i, l_i, start, hi, qpos, bt, kc_ptr, vc_ptr, off_h, s_blk, s_pos,
                                             scale2, k_scale, v_scale, d, j, BS, WINDOW, FP8, IEEE, True)
        else:
            # Keys before the last whole step of BNF at or below p0 are seen
            # by every query of the tile: no masks there, and longer steps
            # (a long prefix's keys are most of the work).
            full = (p0 // BNF) * BNF
            jf = tl.arange(0, BNF)
            for start in range(lo, full, BNF):
                acc, m_i, l_i = _prompt_keys(q, acc, m_i, l_i, start, hi, qpos, bt, kc_ptr, vc_ptr, off_h, s_blk, s_pos,
                                             scale2, k_scale, v_scale, d, jf, BS, WINDOW, FP8, IEEE, False)
            for start in range(full, hi, BN):
                acc, m_i, l_i = _prompt_keys(q, acc, m_i, l_i, start, hi, qpos, bt, kc_ptr, vc_ptr, off_h, s_blk, s_pos,
                                             scale2, k_scale, v_scale, d, j, BS, WINDOW, FP8, IEEE, True)
        o = acc / l_i[:, None]
        tl.store(out_ptr + (a + tok).to(tl.int64)[:, None] * (H * HD) + head[:, None] + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=rm[:, None])


def _prompt_config(hd, elem):
    """(keys a masked step, keys an unmasked step, warps, stages) of
    prompt_attention for heads of hd dims, elem bytes an element of the
    pool."""
    if PROMPT_CONFIG is not None:
        return PROMPT_CONFIG
    # The sweeps' best on an H200 (testdata/prompt_attention_test.py
    # --bench): 64 keys a step and 8 warps; for 64-wide heads of two bytes,
    # three stages and steps of 128 keys through a prefix, 20-30% less
    # time after prefixes of 2,048 to 8,000 tokens (their K and V tiles fit
    # the shared memory three times over; wider ones do not).
    if hd <= 64 and elem <= 2:
        return (64, 128, 8, 3)
    return (64, 64, 8, 3 if hd <= 64 else 2)


def prompt_attention(q, kc, vc, table, tiles, ntiles, out, heads, kv_heads, tb, scale=None, window=0, k_scale=1.0,
                     v_scale=1.0):
    """Causal attention of a step's prompt chunks over their sequences'
    blocks, read in place through the block table: no gather of the
    cache, so nothing in it depends on the host but tiles, and a CUDA
    graph can hold it. q [N, >= H, hd] (row stride any; the rotated
    queries of the step's packed rows), kc, vc [blocks, block_size, K,
    hd] (float8_e4m3fn: read with k_scale and v_scale), table [rows,
    max_blocks] int32; tiles [4, >= ntiles] int32, one column a program:
    its first packed row, its token count (at most tb; 0: none), that
    row's position and the sequence's table row (prefill.tile_plan); tb
    times the query heads of a KV head, rounded up to a power of two, is
    a power of two of at least 16 (a program's rows). A
    chunk's tokens see every key of their sequence up to their own
    position (pos - window < j in a sliding layer); the chunk's own keys
    must be in the blocks already (rope_kv). Writes out [N, H * hd]."""
    hd = kc.shape[-1]
    rep = heads // kv_heads
    repp = triton.next_power_of_2(rep)
    if scale is None:
        scale = 1.0 / math.sqrt(hd)
    bn, bnf, warps, stages = _prompt_config(hd, kc.element_size())
    _prompt_attn_kernel[(kv_heads, ntiles)](
        q, kc, vc, out, table, tiles, q.stride(0), table.stride(0), kc.stride(0), kc.stride(1), kc.stride(2),
        tiles.stride(0), scale * LOG2E, float(k_scale), float(v_scale),
        H=heads, REP=rep, REPP=repp, ROWS=tb * repp, HD=hd, BS=kc.shape[1], BN=bn, BNF=bnf, WINDOW=window,
        FP8=kc.dtype == FLOAT8, IEEE=q.dtype == torch.float32, num_warps=warps, num_stages=stages)
    return out


@triton.jit
def _argmax_part_kernel(x_ptr, val_ptr, idx_ptr, n, NCH: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + offs, mask=offs < n, other=float("-inf"))
    v, i = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(val_ptr + row * NCH + c, v)
    tl.store(idx_ptr + row * NCH + c, c * BLOCK + i)


@triton.jit
def _argmax_final_kernel(val_ptr, idx_ptr, out_ptr, NCH: tl.constexpr, NB: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, NB)
    v = tl.load(val_ptr + row * NCH + c, mask=c < NCH, other=float("-inf"))
    _, i = tl.max(v, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(out_ptr + row, tl.load(idx_ptr + row * NCH + i).to(tl.int64))


def argmax(x):
    """torch.argmax(x, -1) for a contiguous float [B, n] (the first index
    of the largest value), in two passes that fill the GPU."""
    B, n = x.shape
    BLOCK = 4096
    nch = triton.cdiv(n, BLOCK)
    val = torch.empty(B, nch, device=x.device, dtype=torch.float32)
    idx = torch.empty(B, nch, device=x.device, dtype=torch.int32)
    out = torch.empty(B, device=x.device, dtype=torch.int64)
    _argmax_part_kernel[(B, nch)](x, val, idx, n, NCH=nch, BLOCK=BLOCK, num_warps=8)
    _argmax_final_kernel[(B,)](val, idx, out, NCH=nch, NB=triton.next_power_of_2(nch), num_warps=1)
    return out


def usable(cfg, dtype):
    """Whether these kernels cover the model's shapes."""
    hd = cfg.head_dim
    return hd >= 16 and hd & (hd - 1) == 0 and cfg.heads % cfg.kv_heads == 0 and cfg.heads // cfg.kv_heads <= 64


def probe(device, dtype, heads, kv_heads, hd, rot=None, scale=None, window=0, norm="llama", kv_dtype=None, sinks=False,
          qk_norm=False, moe_k=0):
    """Runs each kernel once on zeros in the model's shapes (its heads,
    head dim, rotated dims, attention scale, sliding window, RMSNorm kind,
    KV pool dtype, None: dtype, sinks, per-head QK norms inside the decode
    attention and a mixture's k choices summed by add_rms; blocks of 16
    and 32 tokens; a cache long enough to split), so
    that each is built for this device now: one Triton cannot build or run
    here raises at load, where the decoder falls back to plain torch,
    rather than in a step. Whether the kernels agree with plain torch is
    testdata/kernels_test.py's to check."""
    rot = rot or hd
    zeros = lambda *s: torch.zeros(*s, device=device, dtype=dtype)
    B, ctx = 3, 4100
    add_rms(zeros(B, 256), zeros(B, 256), zeros(256), 1e-5, norm)
    if moe_k:
        add_rms(zeros(B, 256), zeros(B, moe_k, 256), zeros(256), 1e-5, norm)
    silu_mul(zeros(B, 600))
    qkn = (zeros(hd), zeros(hd), 1e-6, norm) if qk_norm else None
    qkv = zeros(B, (heads + 2 * kv_heads) * hd)
    rows = torch.tensor([2, 1, 3], device=device)
    pos = torch.tensor([0, 37, ctx - 1], device=device)
    cos, sin = zeros(ctx, hd) + 1, zeros(ctx, hd)
    sink = torch.zeros(heads, device=device) if sinks else None
    for bs in (16, 32):
        nb = -(-ctx // bs)
        kc, vc = (kvcache.zeros((B * nb + 1, bs, kv_heads, hd), device, kv_dtype or dtype) for _ in "kv")
        table = torch.full((B + 1, nb), B * nb, dtype=torch.int32)
        table[1:] = torch.arange(B * nb, dtype=torch.int32).view(B, nb)
        table = table.to(device)
        for win in sorted({0, window, 7 if window else 0}):
            for context in (ctx, 1024):
                decode_attention(qkv, kc, vc, table, rows, pos, cos, sin, heads, kv_heads, context, scale, win, rot,
                                 sinks=sink, qk_norm=qkn)
        rope_kv(qkv, kc, vc, rows, pos, cos, sin, heads, kv_heads, rot)
    argmax(torch.zeros(B, 50000, device=device))
    torch.cuda.synchronize(device)


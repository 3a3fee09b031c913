"""Triton GEMMs for quantized weights (quant.py's QWeight), CUDA only.

The weight-only GEMMs read the weight in its quantized form and
dequantize each tile in registers; no decode step makes a float copy of
a weight.

- fp8_linear: x [M, K] (bf16/fp16) times an F8_E4M3 weight [N, K] whose
  scales are per block (bn, bk): (128, 128) for the block-scaled
  checkpoints, (1, K) per channel. Each K tile lies in one block of
  scales, so its partial product is scaled once per output column; the
  one-row loop's tiles may span several whole blocks instead (FP8_WIDE,
  _fp8_wide), each block's partial scaled by its own scale.
  Weight-only: activations stay in their dtype (no activation
  quantization, so no activation scales).
- fp8_mma: the FP8 weights' W8A8 product of w8a8.MMA_MIN_ROWS to
  MMA_MAX_ROWS rows (decode batches, short prompt chunks; w8a8.py), one
  Triton kernel on the FP8 tensor cores, each row's activations
  quantized per 128 inputs; on Hopper and later the products whose tile
  asks for it (tile_table.SHAPE_TILES: the 8B shape's at 64 rows) read
  the weight, and the input's codes, through TMA descriptors (FP8_TMA).
- act_quant and fp8_w8a8: the W8A8 product for more rows: x's rows
  quantized to e4m3 per token by one kernel that reads x once and
  writes the codes and their float32 scales, then torch._scaled_mm.
- int4_linear: x times a 4-bit weight packed GPTQ-style along K (int32
  [K/8, N], input 8r + j in nibble j), with scales and zeros per group of
  g inputs ([K/g, N], the zero as a value; the scales in the file's dtype,
  float16 for GPTQ and AWQ, mostly bfloat16 for compressed-tensors, each
  converted to float32 as loaded): each packed word is loaded once and
  unpacked to its eight inputs in registers, each tile is (q - z) * s in
  float32, rounded to x's dtype, into tl.dot. Act order's gather of x
  (QWeight's perm) is the caller's. INT4_FAST (on by default) routes
  bfloat16/float16 products to faster kernels: a row loop whose nibbles
  become float32 in one LOP3 each, and a tensor-core tile fed 16-bit
  codes OFF + q with the zero and scale applied to its float32 partials
  (see _int4_gemv2_kernel and _int4_dot2_kernel). INT4_H2 (on by
  default) runs one-row products narrower than 16,384 columns through a
  row loop that works in float16 pairs, two weights an instruction
  (_int4_h2_kernel).

Decode steps have few rows (M): the weight is all the traffic, so a
kernel is as fast as it keeps enough of the weight in flight. A grid over
output tiles alone leaves most SMs idle, so the K range is split over
programs (SPLIT_K). Each writes a float32 partial, and the last program
of a tile to finish (a counter per tile, taken with acquire-release
atomics) adds the partials in split order and writes the output in x's
dtype: one kernel per product, deterministic (the order never depends on
timing), where a separate sum would cost two more launches per linear.
The counters are reset by the program that used them, so CUDA graphs
replay them; one set per device, as the worker runs a device's kernels
on one stream.

Prompt chunks (many rows) are compute-bound: there a weight is
dequantized into a scratch buffer once per product and multiplied by
cuBLAS, whose tiles beat a Triton tile that dequantizes per output tile
(the dequantization reads the quantized bytes once and writes the float
weight once, small next to a GEMM of DEQUANT_ROWS rows or more).

The one-row loop (_fp8_gemv_kernel) also runs one-row products of
16-bit weights, with unit scales (quant.ROW_LOOP): cuBLAS's kernels
launch without PDL and leave SwiGLU and the norms to kernels of their
own. One-row down projections take SwiGLU's inputs straight from the
packed gate and up rows (fp8_linear's silu; quant.silu_linear), and
one-row products quant.norm_fits takes (up to quant.NORM_MAX_K inputs,
into up to quant.NORM_MAX_N outputs, or a product with a tile for it in
tile_table.SHAPE_TILES) the residual add and RMSNorm before them
(fp8_norm_linear; quant.norm_linear): one launch fewer each at one token
a step. Every product kernel waits for its predecessor under
programmatic dependent launch and releases its successor once its K loop
is done, act_quant at its start (pdl.py).

Tile sizes come from a table by M, and per product where one shape's
best differs (tile_table.SHAPE_TILES), with no autotuning, so CUDA graph
capture never meets a benchmark run; `cmd/gpubench/quant_sweep.py` and
`rowloop_sweep.py` measure the candidates on a GPU.
"""
import copy
import os

import torch
import triton
import triton.language as tl

from . import pdl, tile_table
from .pdl import release as pdl_release, wait as pdl_wait

try:  # host-side TMA descriptors (Triton 3.4 and later)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:
    TensorDescriptor = None


@triton.jit
def _finish(acc, y_ptr, part_ptr, lock_ptr, tile, pk, split, M, N, offs_m, offs_n, PDL: tl.constexpr):
    """Writes a program's [BLOCK_M, BLOCK_N] float32 partial: straight to
    y when K is not split, else to its slot of part, and the last split
    of the tile to arrive sums the slots in order into y. The K loop is
    over: the next kernel may launch (pdl)."""
    pdl_release(PDL)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    idx = offs_m[:, None] * N + offs_n[None, :]
    if split == 1:
        tl.store(y_ptr + idx, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + pk * M * N + idx, acc, mask=mask)
        # Every thread's partial is stored before one thread's release.
        tl.debug_barrier()
        arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel")
        if arrived == split - 1:
            total = tl.zeros_like(acc)
            for s in range(0, split):
                total += tl.load(part_ptr + s * M * N + idx, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(y_ptr + idx, total.to(y_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(lock_ptr + tile, 0)


@triton.jit
def _fp8_kernel(x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, lock_ptr, M, N, K, k_per, split, sxm, swn, ssn, ssk,
                BN_S: tl.constexpr, BK_S: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, PDL: tl.constexpr, SILU: tl.constexpr, NB: tl.constexpr):
    tl.static_assert(SILU == 0)  # quant.silu_linear: one row, the row loop
    tl.static_assert(NB == 1)  # wide K tiles: the row loop's (_fp8_wide)
    pdl_wait(PDL)
    pid, pk = tl.program_id(0), tl.program_id(1)
    nn = tl.cdiv(N, BLOCK_N)
    pm, pn = pid // nn, pid % nn
    offs_m = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k0 = pk * k_per
    for kk in range(0, k_per, BLOCK_K):
        ks = k0 + kk
        offs_k = ks + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + offs_m[:, None] * sxm + offs_k[None, :],
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        b = tl.load(w_ptr + offs_n[None, :] * swn + offs_k[:, None],
                    mask=(offs_n[None, :] < N) & (offs_k[:, None] < K), other=0.0)
        s = tl.load(s_ptr + (offs_n // BN_S) * ssn + (ks // BK_S) * ssk, mask=(offs_n < N) & (ks < K), other=0.0)
        acc += tl.dot(a, b.to(a.dtype)) * s[None, :]
    _finish(acc, y_ptr, part_ptr, lock_ptr, pid, pk, split, M, N, offs_m, offs_n, PDL)


@triton.jit
def _int4_kernel(x_ptr, q_ptr, s_ptr, z_ptr, y_ptr, part_ptr, lock_ptr, M, N, K, k_per, split, sxm,
                 G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PDL: tl.constexpr):
    pdl_wait(PDL)
    pid, pk = tl.program_id(0), tl.program_id(1)
    nn = tl.cdiv(N, BLOCK_N)
    pm, pn = pid // nn, pid % nn
    offs_m = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    shifts = tl.arange(0, 8) * 4
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k0 = pk * k_per
    for kk in range(0, k_per, BLOCK_K):
        ks = k0 + kk
        offs_k = ks + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + offs_m[:, None] * sxm + offs_k[None, :],
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        offs_r = ks // 8 + tl.arange(0, BLOCK_K // 8)
        words = tl.load(q_ptr + offs_r[:, None] * N + offs_n[None, :],
                        mask=(offs_r[:, None] < K // 8) & (offs_n[None, :] < N), other=0)
        # Row r of words holds inputs 8r..8r+7: unpacked [BLOCK_K/8, 8, BLOCK_N]
        # laid out row-major is input order.
        q = tl.reshape((words[:, None, :] >> shifts[None, :, None]) & 0xF, (BLOCK_K, BLOCK_N))
        g = ks // G
        nmask = (offs_n < N) & (ks < K)
        s = tl.load(s_ptr + g * N + offs_n, mask=nmask, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + g * N + offs_n, mask=nmask, other=0.0).to(tl.float32)
        w = ((q.to(tl.float32) - z[None, :]) * s[None, :]).to(a.dtype)
        acc += tl.dot(a, w)
    _finish(acc, y_ptr, part_ptr, lock_ptr, pid, pk, split, M, N, offs_m, offs_n, PDL)


@triton.jit
def _fp8_gemv_kernel(x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, lock_ptr, M, N, K, k_per, split, sxm, swn, ssn, ssk,
                     BN_S: tl.constexpr, BK_S: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, PDL: tl.constexpr, SILU: tl.constexpr, NB: tl.constexpr):
    # A few rows: no tensor cores. Each weight tile is loaded once along K
    # (its contiguous axis, wide loads), converted in registers and dotted
    # with every row by multiply and sum. SILU: x holds packed gate and up
    # rows ([M, 2K]) and the inputs are silu(gate) * up, as
    # kernels.silu_mul rounds them (quant.silu_linear: one launch fewer).
    # NB: the scale blocks a K tile spans (_fp8_wide); past one, the tile
    # is [BLOCK_N, NB, BLOCK_K / NB], summed per block and scaled per
    # block, so a row of e4m3 codes moves as many bytes an iteration as a
    # bfloat16 row does at half the width.
    pdl_wait(PDL)
    pn, pk = tl.program_id(0), tl.program_id(1)
    offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k0 = pk * k_per
    for kk in range(0, k_per, BLOCK_K):
        ks = k0 + kk
        if NB == 1:
            offs_k = ks + tl.arange(0, BLOCK_K)
            kmask = offs_k < K
            w = tl.load(w_ptr + offs_n[:, None] * swn + offs_k[None, :],
                        mask=(offs_n[:, None] < N) & kmask[None, :], other=0.0).to(tl.float32)
            s = tl.load(s_ptr + (offs_n // BN_S) * ssn + (ks // BK_S) * ssk, mask=(offs_n < N) & (ks < K),
                        other=0.0)
        else:
            blk = tl.arange(0, NB)
            offs_k = ks + blk[:, None] * (BLOCK_K // NB) + tl.arange(0, BLOCK_K // NB)[None, :]
            kmask = offs_k < K
            w = tl.load(w_ptr + offs_n[:, None, None] * swn + offs_k[None, :, :],
                        mask=(offs_n[:, None, None] < N) & kmask[None, :, :], other=0.0).to(tl.float32)
            s = tl.load(s_ptr + (offs_n // BN_S)[:, None] * ssn + (ks // BK_S + blk)[None, :] * ssk,
                        mask=(offs_n[:, None] < N) & (ks + blk * BK_S < K)[None, :], other=0.0)
        for m in tl.static_range(BLOCK_M):
            xmask = kmask & (m < M)
            if SILU:
                g = tl.load(x_ptr + m * sxm + offs_k, mask=xmask, other=0.0)
                u = tl.load(x_ptr + m * sxm + K + offs_k, mask=xmask, other=0.0)
                xm = silu_times(g, u).to(tl.float32)
            else:
                xm = tl.load(x_ptr + m * sxm + offs_k, mask=xmask, other=0.0).to(tl.float32)
            if NB == 1:
                part = tl.sum(w * xm[None, :], axis=1) * s
            else:
                part = tl.sum(tl.sum(w * xm[None, :, :], axis=2) * s, axis=1)
            acc = tl.where(rows[:, None] == m, acc + part[None, :], acc)
    _finish(acc, y_ptr, part_ptr, lock_ptr, pn, pk, split, M, N, rows, offs_n, PDL)


@triton.jit
def _fp8_norm_gemv_kernel(x_ptr, d_ptr, nw_ptr, xo_ptr, w_ptr, s_ptr, y_ptr, part_ptr, ss_ptr, lock_ptr, N, K,
                          k_per, split, swn, ssn, ssk, eps, BN_S: tl.constexpr, BK_S: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_D: tl.constexpr, OFFSET: tl.constexpr,
                          PDL: tl.constexpr, NB: tl.constexpr):
    # One row of rms_norm(x + d) * nw times the weight, the norm inside
    # (quant.norm_linear): its 1/rms is one number a row, so it comes out
    # of the sum, sum_k W (h_k r nw_k) = r sum_k W h_k nw_k with h = x + d
    # (rounded to x's dtype, as kernels.add_rms stores it). Each program
    # adds its K range's products and its range's sum of h^2, and the one
    # that completes the tile scales the total by 1/rms of the whole row's
    # sum. The programs of the first column tile write h (the residual)
    # after their K loop. NB: as _fp8_gemv_kernel's.
    pdl_wait(PDL)
    pn, pk = tl.program_id(0), tl.program_id(1)
    offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if NB == 1:
        sq = tl.zeros((BLOCK_K,), dtype=tl.float32)
    else:
        sq = tl.zeros((NB, BLOCK_K // NB), dtype=tl.float32)
    k0 = pk * k_per
    for kk in range(0, k_per, BLOCK_K):
        ks = k0 + kk
        if NB == 1:
            offs_k = ks + tl.arange(0, BLOCK_K)
            kmask = offs_k < K
            w = tl.load(w_ptr + offs_n[:, None] * swn + offs_k[None, :], mask=nmask[:, None] & kmask[None, :],
                        other=0.0).to(tl.float32)
            s = tl.load(s_ptr + (offs_n // BN_S) * ssn + (ks // BK_S) * ssk, mask=nmask & (ks < K), other=0.0)
        else:  # [NB, BLOCK_K / NB]: a row a scale block
            blk = tl.arange(0, NB)
            offs_k = ks + blk[:, None] * (BLOCK_K // NB) + tl.arange(0, BLOCK_K // NB)[None, :]
            kmask = offs_k < K
            w = tl.load(w_ptr + offs_n[:, None, None] * swn + offs_k[None, :, :],
                        mask=nmask[:, None, None] & kmask[None, :, :], other=0.0).to(tl.float32)
            s = tl.load(s_ptr + (offs_n // BN_S)[:, None] * ssn + (ks // BK_S + blk)[None, :] * ssk,
                        mask=nmask[:, None] & (ks + blk * BK_S < K)[None, :], other=0.0)
        h = tl.load(x_ptr + offs_k, mask=kmask, other=0.0)
        if HAS_D:
            h = (h.to(tl.float32) + tl.load(d_ptr + offs_k, mask=kmask, other=0.0).to(tl.float32)).to(h.dtype)
        hf = h.to(tl.float32)
        sq += hf * hf
        nw = tl.load(nw_ptr + offs_k, mask=kmask, other=0.0).to(tl.float32)
        if OFFSET:  # Gemma: (1 + w)
            nw = nw + 1.0
        if NB == 1:
            acc += tl.sum(w * (hf * nw)[None, :], axis=1) * s
        else:
            acc += tl.sum(tl.sum(w * (hf * nw)[None, :, :], axis=2) * s, axis=1)
    if NB == 1:
        ss = tl.sum(sq, axis=0)
    else:
        ss = tl.sum(tl.sum(sq, axis=1), axis=0)
    pdl_release(PDL)
    if HAS_D and pn == 0:  # the residual, by the first column tile's programs, each its K range
        for kk in range(0, k_per, BLOCK_K):
            offs_k = k0 + kk + tl.arange(0, BLOCK_K)
            kmask = offs_k < K
            h = tl.load(x_ptr + offs_k, mask=kmask, other=0.0)
            h = (h.to(tl.float32) + tl.load(d_ptr + offs_k, mask=kmask, other=0.0).to(tl.float32)).to(h.dtype)
            tl.store(xo_ptr + offs_k, h, mask=kmask)
    if split == 1:
        rstd = 1.0 / tl.sqrt(ss / K + eps)
        tl.store(y_ptr + offs_n, (acc * rstd).to(y_ptr.dtype.element_ty), mask=nmask)
    else:
        tl.store(part_ptr + pk * N + offs_n, acc, mask=nmask)
        tl.store(ss_ptr + pn * split + pk, ss)
        tl.debug_barrier()  # as _finish: every store before the release
        arrived = tl.atomic_add(lock_ptr + pn, 1, sem="acq_rel")
        if arrived == split - 1:
            total = tl.zeros_like(acc)
            whole = ss * 0.0
            for j in range(0, split):
                total += tl.load(part_ptr + j * N + offs_n, mask=nmask, other=0.0, cache_modifier=".cg")
                whole += tl.load(ss_ptr + pn * split + j, cache_modifier=".cg")
            rstd = 1.0 / tl.sqrt(whole / K + eps)
            tl.store(y_ptr + offs_n, (total * rstd).to(y_ptr.dtype.element_ty), mask=nmask)
            tl.atomic_xchg(lock_ptr + pn, 0)


@triton.jit
def silu_times(g, u):
    """silu(g) * u in g's dtype, rounded where torch rounds F.silu(g) * u:
    the silu, then the product (kernels.silu_mul and _fp8_gemv_kernel's
    SILU inputs both take it here, so they agree bit for bit)."""
    gf = g.to(tl.float32)
    s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)
    return (s.to(tl.float32) * u.to(tl.float32)).to(g.dtype)


@triton.jit
def _int4_gemv_kernel(x_ptr, q_ptr, s_ptr, z_ptr, y_ptr, part_ptr, lock_ptr, M, N, K, k_per, split, sxm,
                      G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      PDL: tl.constexpr):
    # As _fp8_gemv_kernel, over words packed along K ([K/8, N], N
    # contiguous). The words stay [BLOCK_K/8, 8, BLOCK_N] (no reshape: a
    # reshape that interleaves the nibbles moves them between threads),
    # and x is read as [BLOCK_K/8, 8] to match. A nibble becomes a float
    # by the exponent trick (0x4B000000 | q is 2^23 + q as a float32, so
    # one OR and one subtraction, where an int-to-float conversion runs at
    # a quarter of the FP32 rate), and the zero comes out of the sum:
    # sum((q - z) x) s = (sum(q x) - z sum(x)) s, one K tile in one group.
    pdl_wait(PDL)
    pn, pk = tl.program_id(0), tl.program_id(1)
    offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    shifts = tl.arange(0, 8) * 4
    R: tl.constexpr = BLOCK_K // 8
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k0 = pk * k_per
    for kk in range(0, k_per, BLOCK_K):
        ks = k0 + kk
        offs_r = ks // 8 + tl.arange(0, R)
        words = tl.load(q_ptr + offs_r[:, None] * N + offs_n[None, :],
                        mask=(offs_r[:, None] < K // 8) & (offs_n[None, :] < N), other=0)
        nib = ((words[:, None, :] >> shifts[None, :, None]) & 0xF) | 0x4B000000
        q = nib.to(tl.float32, bitcast=True) - 8388608.0
        g = ks // G
        nmask = (offs_n < N) & (ks < K)
        s = tl.load(s_ptr + g * N + offs_n, mask=nmask, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + g * N + offs_n, mask=nmask, other=0.0).to(tl.float32)
        offs_k = ks + tl.arange(0, R)[:, None] * 8 + tl.arange(0, 8)[None, :]
        for m in tl.static_range(BLOCK_M):
            xm = tl.load(x_ptr + m * sxm + offs_k, mask=(offs_k < K) & (m < M), other=0.0).to(tl.float32)
            qx = tl.sum(tl.sum(q * xm[:, :, None], axis=1), axis=0)
            part = (qx - z * tl.sum(tl.sum(xm, axis=1), axis=0)) * s
            acc = tl.where(rows[:, None] == m, acc + part[None, :], acc)
    _finish(acc, y_ptr, part_ptr, lock_ptr, pn, pk, split, M, N, rows, offs_n, PDL)


# The fast int4 kernels (INT4_FAST) turn nibbles into numbers by the
# magic-number trick without shifting each one to the bottom of its
# register: a nibble ANDed in place and ORed into the mantissa of a float
# whose exponent leaves the mantissa's unit at 1 reads as that float's base
# plus q times the nibble's place, in one LOP3 (inline PTX: ptxas does not
# fuse Triton's AND and OR into one; the LUT of (a & b) | c is
# (0xF0 & 0xCC) | 0xAA = 0xEA). A float32 of exponent 2^23 (0x4B000000)
# holds the nibbles at bits 0..19 exactly (q 2^e, e = 0, 4, 8, 12, 16);
# one logical shift of the word by 20 brings nibbles 5..7 to e = 0, 4, 8.
# Then (v 2^-e) - (2^(23-e) + z) is q - z exactly (one FMA; the zeros are
# integers as the loader makes them): three instructions a weight (the
# LOP3, that FMA and the one into the sum; the H200's SASS of a 128-input
# tile, 512 weights a thread: 516 LOP3, 900 FFMA, 180 FADD) where
# _int4_gemv_kernel's shift, mask, OR, subtraction and FMA were five.


@triton.jit
def _int4_fma_nibble(part, src, LOP3: tl.constexpr, INV: tl.constexpr, c, xk):
    """part + xk (q - z) for src's nibble that LOP3 (its mask) lifts into
    2^23 + q / INV; c is 2^23 INV + z."""
    v = tl.inline_asm_elementwise(LOP3, "=r,r", [src], dtype=tl.int32, is_pure=True, pack=1)
    d = v.to(tl.float32, bitcast=True) * INV - c
    return part + xk * d


@triton.jit
def _int4_gemv2_kernel(x_ptr, q_ptr, s_ptr, z_ptr, y_ptr, part_ptr, lock_ptr, M, N, K, k_per, split, sxm,
                       G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PDL: tl.constexpr):
    # The row loop of INT4_FAST, one row (BLOCK_M 1): each program holds
    # BLOCK_N columns and walks its K range a word row at a time (unrolled
    # over BLOCK_K inputs inside one group), so a nibble's place is a
    # constant, K never crosses threads (no reduction) and each input of x
    # is a scalar every thread loads alike, at a constant offset. Each K
    # tile's float32 sum of (q - z) x is scaled once per column.
    pdl_wait(PDL)
    tl.static_assert(BLOCK_M == 1)
    pn, pk = tl.program_id(0), tl.program_id(1)
    offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    k0 = pk * k_per
    k_end = tl.minimum(k0 + k_per, K)
    for ks in range(k0, k_end, BLOCK_K):
        g = ks // G
        s = tl.load(s_ptr + g * N + offs_n, mask=nmask, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + g * N + offs_n, mask=nmask, other=0.0).to(tl.float32)
        c0, c4, c8 = z + 8388608.0, z + 524288.0, z + 32768.0
        c12, c16 = z + 2048.0, z + 128.0
        xp = x_ptr + ks
        qp = q_ptr + (ks // 8) * N + offs_n
        part = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for r in tl.static_range(BLOCK_K // 8):
            w = tl.load(qp + r * N, mask=nmask, other=0)
            hi = w.to(tl.uint32, bitcast=True) >> 20
            hi = hi.to(tl.int32, bitcast=True)
            part = _int4_fma_nibble(part, w, "lop3.b32 $0, $1, 0xF, 0x4B000000, 0xEA;", 1.0, c0,
                                    tl.load(xp + 8 * r).to(tl.float32))
            part = _int4_fma_nibble(part, w, "lop3.b32 $0, $1, 0xF0, 0x4B000000, 0xEA;", 0.0625, c4,
                                    tl.load(xp + (8 * r + 1)).to(tl.float32))
            part = _int4_fma_nibble(part, w, "lop3.b32 $0, $1, 0xF00, 0x4B000000, 0xEA;", 0.00390625, c8,
                                    tl.load(xp + (8 * r + 2)).to(tl.float32))
            part = _int4_fma_nibble(part, w, "lop3.b32 $0, $1, 0xF000, 0x4B000000, 0xEA;", 0.000244140625, c12,
                                    tl.load(xp + (8 * r + 3)).to(tl.float32))
            part = _int4_fma_nibble(part, w, "lop3.b32 $0, $1, 0xF0000, 0x4B000000, 0xEA;", 0.0000152587890625,
                                    c16, tl.load(xp + (8 * r + 4)).to(tl.float32))
            part = _int4_fma_nibble(part, hi, "lop3.b32 $0, $1, 0xF, 0x4B000000, 0xEA;", 1.0, c0,
                                    tl.load(xp + (8 * r + 5)).to(tl.float32))
            part = _int4_fma_nibble(part, hi, "lop3.b32 $0, $1, 0xF0, 0x4B000000, 0xEA;", 0.0625, c4,
                                    tl.load(xp + (8 * r + 6)).to(tl.float32))
            part = _int4_fma_nibble(part, hi, "lop3.b32 $0, $1, 0xF00, 0x4B000000, 0xEA;", 0.00390625, c8,
                                    tl.load(xp + (8 * r + 7)).to(tl.float32))
        acc += part * s
    _finish(acc[None, :], y_ptr, part_ptr, lock_ptr, pn, pk, split, M, N, tl.arange(0, 1), offs_n, PDL)


# The packed int4 row loop (INT4_H2) works two inputs an instruction:
# float16 pairs, the low half of a word holding nibbles 0-3 and the high
# half nibbles 4-7. One LOP3 ORs nibbles j and j + 4 into the mantissas of
# two float16s 1024 (0x6400, mantissa unit 1): 1024 + q at bits 0 and 16,
# 1024 + 16q at bits 4 and 20; the word shifted by 8 gives nibbles 2, 6
# and 3, 7 the same way. One SUB.F16X2 of 1024 + z (or one FMA.F16X2 by
# 1/16 less 64 + z) leaves q - z exactly (integers below 2048), one
# FMA.F16X2 a pair multiplies it by the inputs (j, j + 4): per word 4
# LOP3, a shift, 4 dequantizing and 4 multiplying instructions, then the
# two float16 halves to float32 and added: 16 instructions for 8 weights
# where _int4_gemv2_kernel takes about 25. The float16 sum of a word's
# four products holds at most 60 |x|, so x enters scaled by 1/16 (the
# scale takes the 16 back in float32): no overflow below |x| of 17,000.
# (A constexpr: a kernel reads no other global.)
_INT4_H2_WORD = tl.constexpr("""{
.reg .b32 %qa, %qb, %qc, %qd, %qw, %qt, %qk;
.reg .b16 %ql, %qh;
.reg .f32 %fl, %fh;
lop3.b32 %qa, $1, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 %qb, $1, 0x00F000F0, 0x64006400, 0xEA;
shr.u32 %qw, $1, 8;
lop3.b32 %qc, %qw, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 %qd, %qw, 0x00F000F0, 0x64006400, 0xEA;
mov.b32 %qk, 0x2C002C00;
sub.f16x2 %qa, %qa, $6;
fma.rn.f16x2 %qb, %qb, %qk, $7;
sub.f16x2 %qc, %qc, $6;
fma.rn.f16x2 %qd, %qd, %qk, $7;
mul.f16x2 %qt, %qa, $2;
fma.rn.f16x2 %qt, %qb, $3, %qt;
fma.rn.f16x2 %qt, %qc, $4, %qt;
fma.rn.f16x2 %qt, %qd, $5, %qt;
mov.b32 {%ql, %qh}, %qt;
cvt.f32.f16 %fl, %ql;
cvt.f32.f16 %fh, %qh;
add.f32 $0, %fl, %fh;
}""")


@triton.jit
def _f16x2(lo, hi):
    """The float16 pair (lo, hi) of two float32 tensors, as int32 bits."""
    return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", [lo, hi], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _x_pair(xp, j: tl.constexpr, BLOCK_N: tl.constexpr):
    """Inputs j and j + 4 of each word row xp points at, over 16, as a
    float16 pair broadcast over BLOCK_N columns."""
    lo = tl.load(xp + j).to(tl.float32) * 0.0625
    hi = tl.load(xp + (j + 4)).to(tl.float32) * 0.0625
    pair = _f16x2(lo, hi)
    return tl.broadcast_to(pair[None, :], (BLOCK_N, pair.shape[0]))


@triton.jit
def _int4_h2_kernel(x_ptr, q_ptr, s_ptr, z_ptr, y_ptr, part_ptr, lock_ptr, M, N, K, k_per, split, sxm,
                    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    PDL: tl.constexpr):
    # The packed row loop (above), one row: a program's [BLOCK_N, BLOCK_K/8]
    # tile of words is loaded along N (contiguous in the GPTQ layout), each
    # word row's inputs are packed into the four pairs once per program and
    # K tile, and each word's float32 sum times its column's scale stays in
    # a [BLOCK_N, BLOCK_K/8] accumulator, reduced over K once at the end.
    pdl_wait(PDL)
    tl.static_assert(BLOCK_M == 1)
    R: tl.constexpr = BLOCK_K // 8
    pn, pk = tl.program_id(0), tl.program_id(1)
    offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    offs_r = tl.arange(0, R)
    acc = tl.zeros((BLOCK_N, R), dtype=tl.float32)
    k0 = pk * k_per
    k_end = tl.minimum(k0 + k_per, K)
    for ks in range(k0, k_end, BLOCK_K):
        g = ks // G
        s = tl.load(s_ptr + g * N + offs_n, mask=nmask, other=0.0).to(tl.float32) * 16.0
        z = tl.load(z_ptr + g * N + offs_n, mask=nmask, other=0.0).to(tl.float32)
        zlo = _f16x2(z + 1024.0, z + 1024.0)
        zhi = _f16x2(-64.0 - z, -64.0 - z)
        words = tl.load(q_ptr + ((ks // 8) + offs_r)[None, :] * N + offs_n[:, None], mask=nmask[:, None], other=0)
        xp = x_ptr + ks + offs_r * 8
        word = tl.inline_asm_elementwise(_INT4_H2_WORD, "=f,r,r,r,r,r,r,r",
                                         [words, _x_pair(xp, 0, BLOCK_N), _x_pair(xp, 1, BLOCK_N),
                                          _x_pair(xp, 2, BLOCK_N), _x_pair(xp, 3, BLOCK_N),
                                          tl.broadcast_to(zlo[:, None], (BLOCK_N, R)),
                                          tl.broadcast_to(zhi[:, None], (BLOCK_N, R))],
                                         dtype=tl.float32, is_pure=True, pack=1)
        acc += word * s[:, None]
    _finish(tl.sum(acc, axis=1)[None, :], y_ptr, part_ptr, lock_ptr, pn, pk, split, M, N, tl.arange(0, 1), offs_n,
            PDL)


@triton.jit
def _int4_codes(words, MAGIC: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, dtype: tl.constexpr):
    """The [BLOCK_K, BLOCK_N] tile of words [BLOCK_K/8, BLOCK_N] as 16-bit
    floats OFF + q (MAGIC: OFF's bits, its mantissa's unit 1), exact."""
    shifts = tl.arange(0, 8) * 4
    codes = ((words[:, None, :] >> shifts[None, :, None]) & 0xF) | MAGIC
    return tl.reshape(codes, (BLOCK_K, BLOCK_N)).to(tl.int16).to(dtype, bitcast=True)


@triton.jit
def _int4_dot2_kernel(x_ptr, q_ptr, s_ptr, z_ptr, y_ptr, part_ptr, lock_ptr, M, N, K, k_per, split, sxm,
                      G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      MAGIC: tl.constexpr, OFF: tl.constexpr, SWAP: tl.constexpr, PDL: tl.constexpr):
    # The tensor-core tile of INT4_FAST: the nibbles go into tl.dot as the
    # 16-bit floats OFF + q (an OR a nibble: no int-to-float conversion,
    # subtraction or scaling in the tile), and the zero and scale apply to
    # the float32 partial of each K tile (inside one group):
    # sum((q - z) x) s = (sum((OFF + q) x) - (OFF + z) sum(x)) s. SWAP
    # computes the transposed tile (weight columns by rows of x), so a few
    # rows fill the MMA's narrow side.
    pdl_wait(PDL)
    pid, pk = tl.program_id(0), tl.program_id(1)
    nn = tl.cdiv(N, BLOCK_N)
    pm, pn = pid // nn, pid % nn
    offs_m = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k0 = pk * k_per
    k_end = tl.minimum(k0 + k_per, K)
    for ks in range(k0, k_end, BLOCK_K):
        offs_k = ks + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + offs_m[:, None] * sxm + offs_k[None, :], mask=offs_m[:, None] < M, other=0.0)
        offs_r = ks // 8 + tl.arange(0, BLOCK_K // 8)
        words = tl.load(q_ptr + offs_r[:, None] * N + offs_n[None, :], mask=nmask[None, :], other=0)
        c = _int4_codes(words, MAGIC, BLOCK_K, BLOCK_N, a.dtype)
        g = ks // G
        s = tl.load(s_ptr + g * N + offs_n, mask=nmask, other=0.0).to(tl.float32)
        zo = tl.load(z_ptr + g * N + offs_n, mask=nmask, other=0.0).to(tl.float32) + OFF
        xsum = tl.sum(a.to(tl.float32), axis=1)
        if SWAP:
            d = tl.dot(tl.trans(c), tl.trans(a))
            acc += (d - zo[:, None] * xsum[None, :]) * s[:, None]
        else:
            d = tl.dot(a, c)
            acc += (d - xsum[:, None] * zo[None, :]) * s[None, :]
    if SWAP:
        _finish(tl.trans(acc), y_ptr, part_ptr, lock_ptr, pid, pk, split, M, N, offs_m, offs_n, PDL)
    else:
        _finish(acc, y_ptr, part_ptr, lock_ptr, pid, pk, split, M, N, offs_m, offs_n, PDL)


# Not specialized on the values that vary between a model's products of
# one K (the rows, the K split, the strides of the scales), so w8a8.warm's
# products at load compile every variant serving runs.
@triton.jit(do_not_specialize=["M", "split", "ssam", "ssag", "ssn"])
def _fp8_mma_kernel(x_ptr, sa_ptr, w_ptr, s_ptr, y_ptr, part_ptr, lock_ptr, M, N, K, k_per, split, sxm, ssam, ssag,
                    swn, ssn, ssk, BN_S: tl.constexpr, BK_S: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP: tl.constexpr, PRE: tl.constexpr,
                    TMA: tl.constexpr, PDL: tl.constexpr):
    # W8A8 on the FP8 tensor cores: each K tile (ACT_GROUP inputs, inside
    # one block of the weight's scales) of each row of x in e4m3 under its
    # own scale (its max / 448), dotted with the weight's e4m3 tile as
    # stored, the float32 partial scaled by the row's and the weight's
    # scales. PRE: x holds act_quant's codes and sa_ptr their scales;
    # else x is the activations, quantized here by every program that
    # reads them. SWAP computes the transposed tile (weight rows x
    # tokens), so a few tokens fill the MMA's narrow side and the weight
    # its 64-row side. TMA 1: w_ptr is a tensor descriptor of the weight
    # ([BLOCK_N, BLOCK_K] boxes, zero past its edges): the weight's tiles
    # stream through the copy engine instead of every thread's loads; 2:
    # with PRE, x_ptr one of the codes too ([BLOCK_M, BLOCK_K] boxes).
    pdl_wait(PDL)
    pid, pk = tl.program_id(0), tl.program_id(1)
    nn = tl.cdiv(N, BLOCK_N)
    pm, pn = pid // nn, pid % nn
    offs_m = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k0 = pk * k_per
    for kk in range(0, k_per, BLOCK_K):
        ks = k0 + kk
        offs_k = ks + tl.arange(0, BLOCK_K)
        xmask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
        if PRE:
            if TMA == 2:
                aq = x_ptr.load([pm * BLOCK_M, ks])
            else:
                aq = tl.load(x_ptr + offs_m[:, None] * sxm + offs_k[None, :], mask=xmask, other=0.0)
            sa = tl.load(sa_ptr + offs_m * ssam + (ks // BLOCK_K) * ssag, mask=(offs_m < M) & (ks < K), other=0.0)
        else:
            a = tl.load(x_ptr + offs_m[:, None] * sxm + offs_k[None, :], mask=xmask, other=0.0).to(tl.float32)
            sa = tl.maximum(tl.max(tl.abs(a), axis=1) / 448.0, 1e-12)
            aq = tl.minimum(tl.maximum(a / sa[:, None], -448.0), 448.0)
            if TMA:  # the descriptor's weights are float8_e4m3fn (fp8_mma)
                aq = aq.to(tl.float8e4nv)
            else:
                aq = aq.to(w_ptr.dtype.element_ty)
        if TMA:
            w = w_ptr.load([pn * BLOCK_N, ks])
        else:
            w = tl.load(w_ptr + offs_n[:, None] * swn + offs_k[None, :],
                        mask=(offs_n[:, None] < N) & (offs_k[None, :] < K), other=0.0)
        sw = tl.load(s_ptr + (offs_n // BN_S) * ssn + (ks // BK_S) * ssk, mask=(offs_n < N) & (ks < K), other=0.0)
        if SWAP:
            acc += tl.dot(w, tl.trans(aq)) * sw[:, None] * sa[None, :]
        else:
            acc += tl.dot(aq, tl.trans(w)) * sa[:, None] * sw[None, :]
    if SWAP:
        _finish(tl.trans(acc), y_ptr, part_ptr, lock_ptr, pid, pk, split, M, N, offs_m, offs_n, PDL)
    else:
        _finish(acc, y_ptr, part_ptr, lock_ptr, pid, pk, split, M, N, offs_m, offs_n, PDL)


@triton.jit
def _fp8_dequant_kernel(w_ptr, s_ptr, out_ptr, N, K, swn, ssn, ssk, BN_S: tl.constexpr, BK_S: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
    w = tl.load(w_ptr + offs_n[:, None] * swn + offs_k[None, :], mask=mask, other=0.0)
    s = tl.load(s_ptr + (offs_n[:, None] // BN_S) * ssn + (offs_k[None, :] // BK_S) * ssk, mask=mask, other=0.0)
    tl.store(out_ptr + offs_n[:, None] * K + offs_k[None, :], (w.to(tl.float32) * s).to(out_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def e4m3_groups(x):
    # x float32 [groups, group]: each group's e4m3 values (still float32)
    # under its own scale, its max / 448, and the scales. Every kernel
    # that quantizes activations for fp8_mma does it here, so the codes
    # do not depend on which kernel wrote them.
    s = tl.maximum(tl.max(tl.abs(x), axis=1) / 448.0, 1e-12)
    return tl.minimum(tl.maximum(x / s[:, None], -448.0), 448.0), s


@triton.jit(do_not_specialize=["M", "ssg"])  # as _fp8_mma_kernel: one compile a width
def _act_quant_kernel(x_ptr, q_ptr, s_ptr, M, K, sxm, ssm, ssg, GROUP: tl.constexpr, GROUPS: tl.constexpr,
                      PDL: tl.constexpr):
    # One row a program, read once: its K inputs as GROUPS groups of GROUP
    # (one group: the whole row), each scaled by its own max / 448 into
    # e4m3 codes. Rows from M on (padding) get zero codes.
    pdl_wait(PDL)
    pdl_release(PDL)
    m = tl.program_id(0)
    offs = tl.arange(0, GROUPS)[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    x = tl.load(x_ptr + m * sxm + offs, mask=(offs < K) & (m < M), other=0.0).to(tl.float32)
    q, s = e4m3_groups(x)
    tl.store(q_ptr + m * K + offs, q.to(q_ptr.dtype.element_ty), mask=offs < K)
    g = tl.arange(0, GROUPS)
    tl.store(s_ptr + m * ssm + g * ssg, s, mask=g * GROUP < K)


@triton.jit
def _int4_dequant_kernel(q_ptr, s_ptr, z_ptr, out_ptr, N, K, G: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    # out is [N, K] (the weight as nn.Linear holds it), read from [K/8, N] words.
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    kt = tl.program_id(1) * BLOCK_K
    offs_r = kt // 8 + tl.arange(0, BLOCK_K // 8)
    words = tl.load(q_ptr + offs_r[:, None] * N + offs_n[None, :],
                    mask=(offs_r[:, None] < K // 8) & (offs_n[None, :] < N), other=0)
    shifts = tl.arange(0, 8) * 4
    q = tl.reshape((words[:, None, :] >> shifts[None, :, None]) & 0xF, (BLOCK_K, BLOCK_N))
    offs_k = kt + tl.arange(0, BLOCK_K)
    mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
    grp = offs_k[:, None] // G
    s = tl.load(s_ptr + grp * N + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + grp * N + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    w = (q.to(tl.float32) - z) * s
    tl.store(out_ptr + offs_n[None, :] * K + offs_k[:, None], w.to(out_ptr.dtype.element_ty), mask=mask)


# Products of at least this many rows dequantize the weight for cuBLAS
# (see the module's doc); fewer run the fused kernels.
DEQUANT_ROWS = 256

_sms = {}
_locks = {}
_no_part = {}  # device -> a float32 scalar fp8_mma passes as part when K is not split
_LOCKS = 4096  # split products have fewer tiles than 2 waves of SMs


def _device_state(device):
    if device not in _sms:
        _sms[device] = torch.cuda.get_device_properties(device).multi_processor_count
        _locks[device] = torch.zeros(_LOCKS, dtype=torch.int32, device=device)
        _no_part[device] = torch.zeros(1, dtype=torch.float32, device=device)
    return _sms[device], _locks[device]


# Whether int4 products of fewer than DEQUANT_ROWS rows run the fast
# kernels (_int4_gemv2_kernel, _int4_dot2_kernel) instead of
# _int4_gemv_kernel and _int4_kernel: on (measured on an H200, 8B shape,
# GPTQ: decode 1.15x at batch 1, 1.19x at 16, 1.09x at 64; BENCHMARKS.md).
# MLXSERVING_INT4_FAST=0 in the worker's environment turns it off, read
# once here so one binary measures both; quant.py turns it off, logged,
# where the fast kernels fail self_check and the others pass.
INT4_FAST = os.environ.get("MLXSERVING_INT4_FAST", "") != "0"
# Whether the fast kernels' one-row product runs the packed row loop
# (_int4_h2_kernel) rather than _int4_gemv2_kernel. MLXSERVING_INT4_H2=0
# turns it off (an A/B on one binary); quant.py turns it off, logged, where
# it fails self_check and the rest passes.
INT4_H2 = os.environ.get("MLXSERVING_INT4_H2", "") != "0"


# Whether the row loop's tiles that ask for it (a Tiles.bk of whole scale
# blocks past one) read K tiles that wide (_fp8_wide): FP8 and 16-bit
# weights at one row, 1.05x decode at the 8B shape (FP8, tile_table).
# MLXSERVING_FP8_WIDE=0 in the worker's environment turns it off (an A/B
# on one binary); quant.py turns it off, logged, where wide_check fails
# and the rest passes.
FP8_WIDE = os.environ.get("MLXSERVING_FP8_WIDE", "") != "0"


# Whether fp8_mma's tiles that ask for it (Tiles.tma) stream the weight
# through a TMA descriptor (Hopper and later, with a Triton that has host
# descriptors) rather than every thread's loads. MLXSERVING_FP8_TMA=0 in
# the worker's environment turns it off (an A/B on one binary); w8a8.check
# turns it off, logged, where the kernel fails with it and passes without.
FP8_TMA = TensorDescriptor is not None and os.environ.get("MLXSERVING_FP8_TMA", "") != "0"


class Tiles:
    """One product's launch: tile sizes, warps, stages and the K split's
    target (waves: programs per SM the split aims for). fast: int4's
    INT4_FAST kernels (gemv: the row loop, else the tensor-core tile);
    h2: with fast and gemv, the packed row loop (INT4_H2); tma: fp8_mma's
    weight through a TMA descriptor (FP8_TMA) at 1, and at 2 with pre its
    input's codes as well."""

    def __init__(self, bm, bn, warps=4, stages=3, waves=2, gemv=False, bk=None, swap=False, pre=False, fast=False,
                 h2=False, tma=0):
        self.bm, self.bn, self.warps, self.stages, self.waves = bm, bn, warps, stages, waves
        self.gemv, self.bk, self.swap, self.pre, self.fast, self.h2 = gemv, bk, swap, pre, fast, h2
        self.tma = tma

    def replaced(self, **kw):
        """A copy with the fields in kw changed."""
        t = copy.copy(self)
        t.__dict__.update(kw)
        return t

    def __repr__(self):
        kind = "fast h2 " if self.fast and self.h2 else "fast " if self.fast else ""
        kind += "gemv" if self.gemv else "swap" if self.swap else "dot"
        kind += (" pre" if self.pre else "") + ("", " tma", " tma2")[self.tma]
        return "%s bm%d bn%d%s w%d s%d waves%d" % (kind, self.bm, self.bn, " bk%d" % self.bk if self.bk else "",
                                                   self.warps, self.stages, self.waves)


def shaped(t, kind, M, N, K):
    """t with tile_table.SHAPE_TILES' fields for this product, if it has
    any (tile_table.entry: an entry for wide K tiles is passed over
    whole while FP8_WIDE is off)."""
    kw = tile_table.entry(kind, tile_table.rows_bucket(M), N, K, FP8_WIDE)
    return t.replaced(**kw) if kw else t


def tiles_for(M, kind, N=0, fast=None, K=0):
    """The tile table, from cmd/gpubench/quant_sweep.py on an H200 (the
    llama1b and llama8b projections): one row streams the weight through
    the row-loop kernel, narrow tiles and deep K splits; more rows take
    tensor cores, wider tiles as M grows. kind "mma": fp8_mma's tiles.
    One row of int4 over a wide product (N: the 8B's gate_up) streams
    faster in wider tiles: 38.6 against 47.6 us there, the same on the
    narrow ones. fast (INT4_FAST when None): int4's fast kernels'
    tiles. With K, tile_table.SHAPE_TILES' entry for the product over
    the table's (kind "w16" reads the table as "fp8"; int4's fast
    kernels' entries are kind "int4fast"; a row-loop entry's bk past
    128 asks for K tiles over whole scale blocks, _fp8_wide, and is
    passed over while FP8_WIDE is off)."""
    if K:
        key = "int4fast" if kind == "int4" and (INT4_FAST if fast is None else fast) else kind
        t = shaped(tiles_for(M, kind, N, fast), key, M, N, K)
        # An entry's h2 runs only where the packed loop is on (quant.py's
        # self-check may have turned it off).
        return t.replaced(h2=False) if t.h2 and not INT4_H2 else t
    if kind == "w16":
        kind = "fp8"
    if kind == "int4" and (INT4_FAST if fast is None else fast):
        return _int4_fast_tiles(M, N)
    if kind == "mma":  # pre: the activations quantized once by act_quant (measured to win at 32 rows)
        if M <= 16:
            return Tiles(16, 64, 4, 3, 4, swap=True)
        if M <= 32:
            return Tiles(32, 64, 4, 3, 2, swap=True, pre=True)
        return Tiles(64, 64, 4, 3, 2, pre=True)
    if M == 1:
        if kind == "int4" and N >= 16384:
            return Tiles(1, 256, 4, 2, 8, gemv=True, bk=128)
        return Tiles(1, 64, 2, 2, 8, gemv=True, bk=128)
    if M <= 16:
        return Tiles(16, 32, 4, 3, 4) if kind == "fp8" else Tiles(16, 64, 4, 3, 4)
    if M <= 32:
        return Tiles(32, 64, 4, 3, 2)
    if M <= 64:
        return Tiles(64, 64, 4, 3, 2) if kind == "fp8" else Tiles(64, 64, 4, 4, 2)
    return Tiles(64, 128, 4, 3 if kind == "fp8" else 2, 2)


def _int4_fast_tiles(M, N):
    """The fast int4 kernels' tiles, the best of quant_sweep.py --sweep on
    an H200 over the llama1b and llama8b products at 1, 2, 16 and 64 rows:
    the row loop for one row (the packed one, INT4_H2, at its own tile
    from rowloop_sweep.py int4h2tiles-8b), then the transposed
    tensor-core tile up to 32 rows (tokens on the MMA's narrow side), the
    plain one beyond."""
    if M == 1:  # a wide product (gate_up) streams faster in shorter K tiles: fewer registers, more programs
        if N >= 16384:  # the packed loop loses here (29.1 against 27.4 us, 8B gate_up)
            return Tiles(1, 512, 4, 1, 8, gemv=True, bk=64, fast=True)
        if INT4_H2:  # narrow tiles, many programs (rowloop_sweep.py int4h2tiles-8b)
            return Tiles(1, 64, 4, 1, 8, gemv=True, bk=128, fast=True, h2=True)
        return Tiles(1, 256, 4, 1, 8, gemv=True, bk=128, fast=True)
    if M <= 16:
        return Tiles(16, 64, 4, 3, 4, bk=128, swap=True, fast=True)
    if M <= 32:  # not measured
        return Tiles(32, 64, 4, 3, 2, bk=128, swap=True, fast=True)
    return Tiles(64, 64, 4, 3, 2, bk=128, fast=True)


def _plan(M, N, K, unit, sms, t):
    """The K split for an [M, K] x [K, N] product; unit: K per split is a
    multiple of it (the scale block or group)."""
    tiles = -(-M // t.bm) * -(-N // t.bn)
    split = 1
    if tiles < t.waves * sms and tiles <= _LOCKS:
        split = max(1, min(t.waves * sms // tiles, K // (2 * unit)))
    k_per = -(-K // (split * unit)) * unit
    return tiles, -(-K // k_per), k_per


def _run(kernels, x, N, K, unit, bk, args, consts, kind, tiles=None, silu=False, wide=False):
    """One weight-only product. kernels: (tensor-core tile, row loop), or
    for int4 those, the fast pair after them, which Tiles.fast picks, and
    the packed row loop (Tiles.h2); the fast tile takes its own constants
    (_int4_fast_consts). silu: x is packed gate and up rows [..., 2K]
    (fp8's row loop only). wide: fp8's kernels, whose row loop takes K
    tiles over whole scale blocks (_fp8_wide)."""
    shape = x.shape[:-1]
    x2 = x.reshape(-1, 2 * K if silu else K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    t = tiles or tiles_for(M, kind, N, K=K)
    if t.gemv and M > t.bm:  # the row loop covers every row of the product
        t = tiles_for(max(M, 17), kind, N, t.fast)
    assert t.gemv or not silu, t
    kernel = kernels[4] if t.h2 and t.gemv and t.fast else kernels[(1 if t.gemv else 0) + (2 if t.fast else 0)]
    if t.fast and not t.gemv:
        consts = (consts[0], dict(consts[1], **_int4_fast_consts(x.dtype, t)))
    if t.bk and unit % t.bk == 0:
        bk = t.bk
    if wide:
        bk, unit, nb = _fp8_wide(t, bk, unit, consts[1]["BK_S"])
        consts = (consts[0], dict(consts[1], NB=nb))
    sms, locks = _device_state(x.device)
    n_tiles, split, k_per = _plan(M, N, K, unit, sms, t)
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    part = torch.empty(split, M, N, device=x.device, dtype=torch.float32) if split > 1 else y
    kernel[(n_tiles, split)](x2, *args, y, part, locks, M, N, K, k_per, split, x2.stride(0), *consts[0],
                             BLOCK_M=t.bm, BLOCK_N=t.bn, BLOCK_K=bk, num_warps=t.warps, num_stages=t.stages,
                             **consts[1], **pdl.args(x.device, M))
    return y.reshape(*shape, N)


def _fp8_consts(w, scale, block):
    bn, bk = block
    # A scale that spans K (per channel) is one constant for every K, so
    # the kernel compiles once for all of a model's widths.
    return (w.stride(0), scale.stride(0), scale.stride(1)), {"BN_S": bn, "BK_S": bk if bk < w.shape[1] else 1 << 30}


def _fp8_k_tile(bk, K):
    """(BLOCK_K, the K split's unit) of an FP8 weight whose scale blocks
    span bk inputs: K tiles inside one scale block (BLOCK_K divides bk,
    or bk spans K), and splits at whole blocks. A row-loop tile may then
    widen both to several units (_fp8_wide)."""
    kt = 128 if bk % 128 == 0 or bk >= K else 64 if bk % 64 == 0 else 32 if bk % 32 == 0 else 16
    return kt, bk if bk < K else kt


def _fp8_wide(t, kt, unit, bk_s):
    """(BLOCK_K, the K split's unit, NB) of fp8's row loop at tile t,
    from _fp8_k_tile's kt and unit and the kernels' BK_S: a row-loop tile
    whose bk is a whole number of units (scale blocks, or K tiles where
    one scale spans K) reads K tiles that wide, NB scale blocks each
    (powers of two), and splits K at whole tiles."""
    if FP8_WIDE and t.gemv and t.bk and t.bk > unit and t.bk % unit == 0:
        kt = unit = t.bk
    return kt, unit, max(1, kt // bk_s)


def fp8_linear(x, w, scale, block, tiles=None, dequant_rows=None, silu=False):
    """x [..., K] @ dequant(w).T with w float8_e4m3fn [N, K] and scale
    float32 [ceil(N/bn), ceil(K/bk)] for block (bn, bk). silu (one row
    only): x holds packed gate and up rows [1, 2K] and the product's
    inputs are silu(gate) * up, computed by the row loop as it reads them
    (quant.silu_linear)."""
    N, K = w.shape
    if silu:
        assert x.numel() == 2 * K, (x.shape, K)
    elif x.numel() // K >= (dequant_rows or DEQUANT_ROWS):
        return x @ fp8_dequant(w, scale, block, x.dtype).t()
    kt, unit = _fp8_k_tile(block[1], K)
    consts = _fp8_consts(w, scale, block)
    consts[1]["SILU"] = silu
    kind = "fp8" if w.element_size() == 1 else "w16"
    return _run((_fp8_kernel, _fp8_gemv_kernel), x, N, K, unit, kt, (w, scale), consts, kind, tiles, silu, True)


# The fused norm's tiles: four warps a program (cmd/gpubench/rowloop_sweep.py
# on an H200: FP8 qkv 10.2 us against 10.7 with two at the 8B's shape,
# 5.8 against 6.3 at the 1B's).
NORM_TILES = Tiles(1, 64, 4, 2, 8, gemv=True, bk=128)


def fp8_norm_linear(x, d, nw, eps, offset, w, scale, block, tiles=None):
    """One row: (h, rms_norm(h) * nw @ dequant(w).T) with h = x + d (x
    itself where d is None), x and d [1, K] contiguous, nw [K]; offset:
    the norm takes (1 + nw) (Gemma). The norm's rows are not rounded
    before the product (kernels.add_rms rounds them): the product sums
    them in float32 and scales by 1/rms last (_fp8_norm_gemv_kernel)."""
    N, K = w.shape
    assert x.shape == (1, K) and x.is_contiguous() and (d is None or d.shape == x.shape and d.is_contiguous()), \
        (x.shape, None if d is None else d.shape, K)
    kt, unit = _fp8_k_tile(block[1], K)
    t = tiles or shaped(NORM_TILES, "fp8norm" if w.element_size() == 1 else "w16norm", 1, N, K)
    if t.bk and unit % t.bk == 0:
        kt = t.bk
    if block[1] >= K:  # one scale spans K: the split's unit is the K tile
        unit = kt
    consts = _fp8_consts(w, scale, block)
    kt, unit, nb = _fp8_wide(t, kt, unit, consts[1]["BK_S"])
    sms, locks = _device_state(x.device)
    n_tiles, split, k_per = _plan(1, N, K, unit, sms, t)
    y = torch.empty(1, N, device=x.device, dtype=x.dtype)
    xo = torch.empty_like(x) if d is not None else x
    part, ss = y, y
    if split > 1:
        part = torch.empty(split, N, device=x.device, dtype=torch.float32)
        ss = torch.empty(n_tiles, split, device=x.device, dtype=torch.float32)
    _fp8_norm_gemv_kernel[(n_tiles, split)](x, x if d is None else d, nw, xo, w, scale, y, part, ss, locks, N, K,
                                            k_per, split, *consts[0], eps, BLOCK_N=t.bn, BLOCK_K=kt,
                                            HAS_D=d is not None, OFFSET=offset, NB=nb, num_warps=t.warps,
                                            num_stages=t.stages, **consts[1], **pdl.args(x.device, 1))
    return xo, y


# The inputs of a row that fp8_mma quantizes under one scale: one K tile,
# and one block of 128x128-block weights' scales.
ACT_GROUP = 128


def fp8_mma(x, w, scale, block, tiles=None):
    """x [..., K] @ dequant(w).T as W8A8 in a Triton kernel: each row's
    inputs quantized to e4m3 per ACT_GROUP by their own max (so each row
    alone, whatever its batch), FP8 MMA, float32 sums scaled per group
    and weight block (or channel); no cuBLAS floor (w8a8.py). Up to 16
    rows the kernel quantizes the tile it reads (one launch); from 17
    act_quant quantizes x once first, as each program re-reading and
    re-quantizing the rows costs more there than the launch (measured at
    32). Either way the codes and scales are the same. The weight must
    fit (w8a8.mma_fits)."""
    N, K = w.shape
    shape = x.shape[:-1]
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    t = tiles or tiles_for(M, "mma", N, K=K)
    sms, locks = _device_state(x.device)
    n_tiles, split, k_per = _plan(M, N, K, ACT_GROUP, sms, t)
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    # part is float32 either way (unread when K is not split), so a
    # product's K split never changes the kernel's signature: warm-up's
    # products compile what every width of the model runs.
    if split > 1:
        part = torch.empty(split, M, N, device=x.device, dtype=torch.float32)
    else:
        part = _no_part[x.device]
    a, sa = x2, y  # sa unused unless pre
    if t.pre:
        a, sa = _given_for(x2) or act_quant(x2, ACT_GROUP)
    consts = _fp8_consts(w, scale, block)
    wt = _weight_descriptor(w, t.bn) if t.tma else None
    tma, at = (0 if wt is None else 1), a
    if tma and t.tma == 2 and t.pre and a.stride(1) == 1 and a.stride(0) % 16 == 0 and a.data_ptr() % 16 == 0:
        tma, at = 2, TensorDescriptor.from_tensor(a, [t.bm, ACT_GROUP])
    _fp8_mma_kernel[(n_tiles, split)](at, sa, w if wt is None else wt, scale, y, part, locks, M, N, K, k_per, split,
                                      a.stride(0), *(sa.stride() if t.pre else (0, 0)), *consts[0], BLOCK_M=t.bm,
                                      BLOCK_N=t.bn, BLOCK_K=ACT_GROUP, SWAP=t.swap, PRE=t.pre, TMA=tma,
                                      num_warps=t.warps, num_stages=t.stages, **consts[1], **pdl.args(x.device, M))
    return y.reshape(*shape, N)


_tma_devices = {}  # device -> whether it has TMA (compute capability 9.0 and later)


def _weight_descriptor(w, bn):
    """A TMA descriptor of FP8 weight w [N, K] in [bn, ACT_GROUP] boxes,
    or None where TMA is off (FP8_TMA), the GPU has none, or w's layout
    does not take one (e4m3 codes, rows contiguous, 16-byte aligned).
    Made a call (a few microseconds of Python; none when a CUDA graph
    replays): one kept on the weight would hold the weight in a reference
    cycle, whose GPU memory an unload would then free only at the next
    garbage collection."""
    if not FP8_TMA or w.dtype != torch.float8_e4m3fn or w.stride(1) != 1 or w.stride(0) % 16 \
            or w.data_ptr() % 16:
        return None
    if w.device not in _tma_devices:
        _tma_devices[w.device] = torch.cuda.get_device_capability(w.device)[0] >= 9
    if not _tma_devices[w.device]:
        return None
    return TensorDescriptor.from_tensor(w, [bn, ACT_GROUP])


# The fast tensor-core tile's 16-bit codes OFF + q by x's dtype: OFF's
# bits (MAGIC, a nibble ORed into its mantissa's low bits) and OFF.
_INT4_CODES = {torch.bfloat16: (0x4300, 128.0), torch.float16: (0x6400, 1024.0)}


def _int4_fast_consts(dtype, t):
    magic, off = _INT4_CODES[dtype]
    return {"MAGIC": magic, "OFF": off, "SWAP": t.swap}


def int4_linear(x, qw, scales, zeros, g, tiles=None, dequant_rows=None):
    """x [..., K] @ dequant(qw).T with qw int32 [K/8, N], scales (float16,
    bfloat16 or float32) and zeros [K/g, N] (integers, as the loader makes
    them: the fast kernels subtract them exactly only then). Fast tiles
    (INT4_FAST, or tiles with fast set) run the fast kernels for bfloat16
    and float16 x; float32 x keeps the others."""
    K, N = qw.shape[0] * 8, qw.shape[1]
    if x.numel() // K >= (dequant_rows or DEQUANT_ROWS):
        return x @ int4_dequant(qw, scales, zeros, g, x.dtype).t()
    if x.dtype not in _INT4_CODES:
        tiles = tiles if tiles is not None and not tiles.fast else tiles_for(x.numel() // K, "int4", N, False)
    kernels = (_int4_kernel, _int4_gemv_kernel, _int4_dot2_kernel, _int4_gemv2_kernel, _int4_h2_kernel)
    return _run(kernels, x, N, K, g, min(g, 64), (qw, scales, zeros), ((), {"G": g}), "int4", tiles)


def fp8_dequant(w, scale, block, dtype):
    """The float weight [N, K] of an fp8 QWeight, in dtype."""
    N, K = w.shape
    out = torch.empty(N, K, device=w.device, dtype=dtype)
    consts = _fp8_consts(w, scale, block)
    _fp8_dequant_kernel[(-(-N // 64), -(-K // 128))](w, scale, out, N, K, *consts[0], BLOCK_N=64, BLOCK_K=128,
                                                      **consts[1])
    return out


def int4_dequant(qw, scales, zeros, g, dtype):
    """The float weight [N, K] of an int4 QWeight (input order as packed), in dtype."""
    K, N = qw.shape[0] * 8, qw.shape[1]
    out = torch.empty(N, K, device=qw.device, dtype=dtype)
    bk = min(g, 64)
    _int4_dequant_kernel[(-(-N // 64), -(-K // bk))](qw, scales, zeros, out, N, K, G=g, BLOCK_N=64, BLOCK_K=bk)
    return out


def quantized_codes(rows, K, device):
    """Empty codes [rows, K] and scales [rows, K / ACT_GROUP] as
    act_quant lays them out, for a kernel that quantizes its output for
    fp8_mma (kernels.add_rms, silu_mul: quant)."""
    return (torch.empty(rows, K, device=device, dtype=torch.float8_e4m3fn),
            torch.empty(K // ACT_GROUP, rows, device=device, dtype=torch.float32).t())


# The activations of the next fp8_mma product as the kernel that wrote
# them quantized them: (x, its version, codes, scales) or None. At
# 17-64 rows fp8_mma quantizes its input in a launch of its own
# (act_quant); the add+RMSNorm before q/k/v and gate/up and the SwiGLU
# before down write their output's codes as well, one launch fewer
# each (decoder.add_norm, act_mul). One slot: each is read by the
# product right after it, on the worker's one thread.
_given = None


def give(x, q, s):
    """Offers q and s (quantized_codes, filled) as x's codes to the next
    fp8_mma of x."""
    global _given
    _given = (x, x._version, q, s)


def _given_for(x):
    """The codes give offered for x (the same memory, shape and version:
    not written since), once; else None."""
    global _given
    g = _given
    if g is None or g[1] != x._version or g[0].data_ptr() != x.data_ptr() or g[0].shape != x.shape \
            or g[0].stride() != x.stride() or g[0].dtype != x.dtype:
        return None
    _given = None
    return g[2], g[3]


# The widest row _act_quant_kernel holds in one program's registers;
# wider rows are quantized by torch ops (w8a8.act_quant).
ACT_QUANT_MAX = 32768


def act_quant(x, group=None, rows=None):
    """x [M, K] as W8A8's activations: float8_e4m3fn codes [rows, K] and
    float32 scales, per row ([rows, 1]) or, with group, per group of a
    row's inputs ([rows, K/group], column-major: _scaled_mm's 1x128
    layout); rows (M when None) past M are padding with zero codes.
    w8a8.act_quant is the same in torch ops."""
    from . import w8a8
    M, K = x.shape
    rows = rows or M
    width = triton.next_power_of_2(K)
    if width > ACT_QUANT_MAX:
        return w8a8.act_quant(x, group, rows)
    q = torch.empty(rows, K, device=x.device, dtype=torch.float8_e4m3fn)
    if group is None:
        s = torch.empty(rows, 1, device=x.device, dtype=torch.float32)
        groups, group = 1, width
    else:
        s = torch.empty(K // group, rows, device=x.device, dtype=torch.float32).t()
        groups = triton.next_power_of_2(K // group)
    _act_quant_kernel[(rows,)](x, q, s, M, K, x.stride(0), s.stride(0), s.stride(1), GROUP=group, GROUPS=groups,
                               num_warps=8 if width >= 4096 else 4, **pdl.args(x.device, rows))
    return q, s


def fp8_w8a8(x, w, scale, block, v2=False, mma=False, tma=False):
    """x [..., K] @ dequant(w).T as W8A8 on the FP8 tensor cores (see
    w8a8.py): x's rows quantized per token, then cuBLAS's
    scaled GEMM. Per-channel weights (block (1, K), scale [N, 1]) take a
    scale per row of x (rowwise); 128x128 blocks (scale [N/128, K/128])
    one per 128 inputs of a row (the 1x128 recipe cuBLAS pairs with
    them; its row count padded to a multiple of 4). The weight [N, K]
    row-major is passed as w.t(), the column-major operand _scaled_mm
    wants, and its scales transposed: views, no copy a step. v2: the
    block product through torch.nn.functional.scaled_mm (its recipes
    named) instead of torch._scaled_mm (recipes read from the scales'
    shapes). mma: fp8_mma instead (w8a8.route sends it the rows it
    takes); with tma, on its table's tile for the rows with the weight
    (and with pre the codes) through TMA (w8a8.check's TMA case)."""
    if mma:
        tiles = None
        if tma:
            t = tiles_for(x.numel() // x.shape[-1], "mma")
            tiles = t.replaced(tma=2 if t.pre else 1)
        return fp8_mma(x, w, scale, block, tiles)
    N, K = w.shape
    shape = x.shape[:-1]
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    if block[0] == 1:
        q, s = act_quant(x2)
        y = torch._scaled_mm(q, w.t(), scale_a=s, scale_b=scale.t(), out_dtype=x.dtype)
    else:
        q, s = act_quant(x2, block[1], -(-M // 4) * 4)
        if v2:
            F = torch.nn.functional
            y = F.scaled_mm(q, w.t(), s, F.ScalingType.BlockWise1x128, scale.t(), F.ScalingType.BlockWise128x128,
                            output_dtype=x.dtype)
        else:
            y = torch._scaled_mm(q, w.t(), scale_a=s, scale_b=scale.t(), out_dtype=x.dtype)
        y = y[:M]
    return y.reshape(*shape, N)


def self_check(device, dtype):
    """None when both kernels agree with the dequantized product (quant.py)
    on a small case per row count the decode and prefill paths take, else
    what failed. Also compiles the variants before any graph capture."""
    from . import quant
    gen = torch.Generator(device="cpu").manual_seed(0)
    N, K = 384, 512
    w = torch.randn(N, K, generator=gen) / K ** 0.5
    cases = []
    # FP8, per 128 block and per channel.
    s = w.abs().amax(1, keepdim=True) / quant.E4M3_MAX
    w8 = (w / s).clamp(-quant.E4M3_MAX, quant.E4M3_MAX).to(torch.float8_e4m3fn)
    cases.append(quant.QWeight("fp8", N, K, w=w8.to(device), scale=s.to(device), block=(1, K)))
    sb = torch.rand(N // 128, K // 128, generator=gen) * 0.01 + 0.001
    cases.append(quant.QWeight("fp8", N, K, w=w8.to(device), scale=sb.to(device), block=(128, 128)))
    # int4 with random nibbles, scales and zeros.
    q = torch.randint(0, 16, (K, N), generator=gen, dtype=torch.int32)
    sc = (torch.rand(K // 128, N, generator=gen) * 0.02).half()
    z = torch.randint(0, 16, (K // 128, N), generator=gen).half()
    cases.append(quant.QWeight("int4", N, K, qw=quant.pack4(q).to(device), scales=sc.to(device), zeros=z.to(device), group=128))
    # bfloat16 scales (compressed-tensors) and an act order's gather.
    perm = torch.randperm(K, generator=gen)
    cases.append(quant.QWeight("int4", N, K, qw=quant.pack4(q).to(device), scales=sc.bfloat16().to(device),
                               zeros=z.to(device), group=128, perm=perm.to(device)))
    # A product as wide as tiles_for's wide int4 tile wants (one row only).
    wide = 16384
    qwide = torch.randint(0, 16, (K, wide), generator=gen, dtype=torch.int32)
    swide = (torch.rand(K // 128, wide, generator=gen) * 0.02).half()
    zwide = torch.randint(0, 16, (K // 128, wide), generator=gen).half()
    cwide = quant.QWeight("int4", wide, K, qw=quant.pack4(qwide).to(device), scales=swide.to(device),
                          zeros=zwide.to(device), group=128)
    for M in (1, 7, 33, 200, DEQUANT_ROWS + 44):
        x = torch.randn(M, K, generator=gen).to(device=device, dtype=dtype)
        for c in cases + ([cwide] if M == 1 else []):
            want = x.float() @ c.dequant(torch.float32).t()
            got = c.forward(x).float()
            err = (got - want).abs().max().item() / (want.abs().max().item() + 1e-6)
            if not err < 2e-2:
                return "%s %r, %d rows: relative error %.3g" % (c.kind, c.t.get("block"), M, err)
    return wide_check(device, dtype) if FP8_WIDE else None


def wide_check(device, dtype):
    """None when the row loop's wide K tiles (_fp8_wide: 256 inputs over
    two FP8 scale blocks with K split, 512 over four; FP8 and 16-bit
    weights; plain, SwiGLU inside and the norm inside) agree with the
    float32 product, else what failed. Also compiles them."""
    import torch.nn.functional as F
    from . import quant
    gen = torch.Generator(device="cpu").manual_seed(2)
    N, K = 384, 1024
    w = torch.randn(N, K, generator=gen) / K ** 0.5
    x = torch.randn(1, K, generator=gen).to(device=device, dtype=dtype)
    gu = (torch.randn(1, 2 * K, generator=gen) * 3).to(device=device, dtype=dtype)
    nw = (torch.rand(K, generator=gen) + 0.5).to(device=device, dtype=dtype)
    g, u = gu.float().chunk(2, dim=-1)
    inputs = {"plain": x.float(), "SwiGLU inside": (F.silu(g).to(dtype) * u.to(dtype)).float(),
              "norm inside": x.float() * torch.rsqrt(x.float().pow(2).mean() + 1e-5) * nw.float()}
    w16 = w.to(device=device, dtype=dtype)
    weights = [("16-bit", w16, torch.ones(1, 1, device=device), quant.WHOLE, w16.float())]
    if hasattr(torch, "float8_e4m3fn"):
        s = w.abs().amax(1, keepdim=True) / quant.E4M3_MAX
        c = quant.QWeight("fp8", N, K, w=(w / s).clamp(-quant.E4M3_MAX, quant.E4M3_MAX).to(torch.float8_e4m3fn)
                          .to(device), scale=(torch.rand(N // 128, K // 128, generator=gen) * 0.01 + 0.001)
                          .to(device), block=(128, 128))
        weights.append(("FP8 128x128", c.t["w"], c.t["scale"], c.t["block"], c.dequant(torch.float32)))
    for t in (Tiles(1, 32, 4, 2, 2, gemv=True, bk=256), Tiles(1, 16, 2, 2, 1, gemv=True, bk=512)):
        for name, wt, scale, block, wf in weights:
            for how, run in (("plain", lambda: fp8_linear(x, wt, scale, block, tiles=t)),
                             ("SwiGLU inside", lambda: fp8_linear(gu, wt, scale, block, tiles=t, silu=True)),
                             ("norm inside", lambda: fp8_norm_linear(x, None, nw, 1e-5, False, wt, scale, block,
                                                                     tiles=t)[1])):
                want = inputs[how] @ wf.t()
                err = (run().float() - want).abs().max().item() / (want.abs().max().item() + 1e-6)
                if not err < 2e-2:
                    return "wide K tile %d, %s %s: relative error %.3g" % (t.bk, name, how, err)
    return None

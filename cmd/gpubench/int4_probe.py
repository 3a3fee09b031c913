"""Where the packed int4 row loop's time goes at one row (issue 33): the
loop of quant_triton._int4_h2_kernel at the tile decode runs, timed as
rowloop_sweep.py times products (CUDA graphs of 20 launches, weights
rotated past L2), with parts of its work taken out:

- full: the loop as decode runs it (checked against int4_linear);
- no-x: the inputs' float16 pairs a constant (no loads or conversions of
  x; the words, scales and zeros as before);
- words: the words loaded and summed as integers, nothing dequantized
  (the loop's memory traffic and its fixed costs alone);
- packed-x: the pairs read from an int32 [K/8, 4] copy of x made once
  (one load a pair instead of two loads, two multiplies and a conversion);
- tiled-words, tiled-full: words and full over the weight stored
  tile-major (each program's [K tile / 8, columns] block of words one
  contiguous run of memory; the timing only: the values are not
  reordered, so full's check is skipped).

If words runs as slowly as full, the loop waits on memory and its fixed
costs, and fewer instructions a weight would not help; if no-x or
packed-x runs faster, the inputs' preparation is what to remove.

    python3 cmd/gpubench/int4_probe.py RUNTIME_DIR [1b] [8b]
"""
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, sys.argv[1])
from mlxsworker.torchrt import pdl, quant, quant_triton as qt  # noqa: E402
from mlxsworker.torchrt.quant_triton import _INT4_H2_WORD, _f16x2, _finish, _x_pair  # noqa: E402
from mlxsworker.torchrt.pdl import wait as pdl_wait  # noqa: E402
from rowbench import SHAPES, bench  # noqa: E402  (this script's folder)

dev = torch.device("cuda")
MODES = ("full", "no-x", "words", "packed-x", "tiled-words", "tiled-full")


@triton.jit
def _probe_kernel(x_ptr, xq_ptr, q_ptr, s_ptr, z_ptr, y_ptr, part_ptr, lock_ptr, M, N, K, k_per, split,
                  G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
                  MODE: tl.constexpr):
    pdl_wait(PDL)
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
        if MODE >= 4:  # tile-major: each [R, BLOCK_N] tile of words one contiguous block
            words = tl.load(q_ptr + ((ks // BLOCK_K) * N + pn * BLOCK_N) * R + offs_r[None, :] * BLOCK_N
                            + tl.arange(0, BLOCK_N)[:, None], mask=nmask[:, None], other=0)
        else:
            words = tl.load(q_ptr + ((ks // 8) + offs_r)[None, :] * N + offs_n[:, None], mask=nmask[:, None],
                            other=0)
        if MODE == 2 or MODE == 4:
            acc += words.to(tl.float32)
        else:
            s = tl.load(s_ptr + g * N + offs_n, mask=nmask, other=0.0).to(tl.float32) * 16.0
            z = tl.load(z_ptr + g * N + offs_n, mask=nmask, other=0.0).to(tl.float32)
            zlo = tl.broadcast_to(_f16x2(z + 1024.0, z + 1024.0)[:, None], (BLOCK_N, R))
            zhi = tl.broadcast_to(_f16x2(-64.0 - z, -64.0 - z)[:, None], (BLOCK_N, R))
            if MODE == 0 or MODE == 5:
                xp = x_ptr + ks + offs_r * 8
                p0, p1 = _x_pair(xp, 0, BLOCK_N), _x_pair(xp, 1, BLOCK_N)
                p2, p3 = _x_pair(xp, 2, BLOCK_N), _x_pair(xp, 3, BLOCK_N)
            elif MODE == 1:
                c = tl.full((BLOCK_N, R), 0x2C002C00, tl.int32)
                p0, p1, p2, p3 = c, c, c, c
            else:
                xq = xq_ptr + ((ks // 8) + offs_r) * 4
                p0 = tl.broadcast_to(tl.load(xq)[None, :], (BLOCK_N, R))
                p1 = tl.broadcast_to(tl.load(xq + 1)[None, :], (BLOCK_N, R))
                p2 = tl.broadcast_to(tl.load(xq + 2)[None, :], (BLOCK_N, R))
                p3 = tl.broadcast_to(tl.load(xq + 3)[None, :], (BLOCK_N, R))
            word = tl.inline_asm_elementwise(_INT4_H2_WORD, "=f,r,r,r,r,r,r,r", [words, p0, p1, p2, p3, zlo, zhi],
                                             dtype=tl.float32, is_pure=True, pack=1)
            acc += word * s[:, None]
    _finish(tl.sum(acc, axis=1)[None, :], y_ptr, part_ptr, lock_ptr, pn, pk, split, M, N, tl.arange(0, 1), offs_n,
            PDL)


def packed_x(x):
    """x [1, K] as the kernel's float16 pairs: int32 [K/8, 4], pair j of
    word row r holding inputs 8r + j and 8r + j + 4, each over 16."""
    h = (x.float().reshape(-1, 8) / 16).half()
    pairs = torch.stack([h[:, :4], h[:, 4:]], dim=-1).contiguous()  # [K/8, 4, 2]: (j, j + 4)
    return pairs.view(torch.int32).reshape(-1, 4).contiguous()


def run(mode, x, xq, qw, sc, z, t):
    K, N = qw.shape[0] * 8, qw.shape[1]
    sms, locks = qt._device_state(x.device)
    n_tiles, split, k_per = qt._plan(1, N, K, 128, sms, t)
    y = torch.empty(1, N, device=x.device, dtype=x.dtype)
    part = torch.empty(split, 1, N, device=x.device, dtype=torch.float32) if split > 1 else y
    _probe_kernel[(n_tiles, split)](x, xq, qw, sc, z, y, part, locks, 1, N, K, k_per, split, G=128, BLOCK_N=t.bn,
                                    BLOCK_K=128, MODE=MODES.index(mode), num_warps=t.warps, num_stages=t.stages,
                                    **pdl.args(x.device, 1))
    return y


for shape in sys.argv[2:] or ["8b"]:
    for name, n, k in SHAPES[shape]:
        nw_ = max(2, -(-(256 << 20) // (n * k // 2)))
        ws = []
        for _ in range(nw_):
            q = torch.randint(0, 16, (k, n), device=dev, dtype=torch.int32)
            ws.append((quant.pack4(q), (torch.rand(k // 128, n, device=dev) * 0.01).half(),
                       torch.full((k // 128, n), 8.0, device=dev).half()))
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        xq = packed_x(x)
        t = qt.tiles_for(1, "int4", n, K=k)
        if not t.h2:
            t = t.replaced(h2=True, bn=64, bk=128, warps=4, stages=1)
        ref = qt.int4_linear(x, *ws[0], 128, tiles=t).float()
        line = "%s %s [%d, %d] (%.1f MB) at %r:" % (shape, name, n, k, n * k / 2e6, t)
        for mode in MODES:
            if mode in ("full", "packed-x"):
                got = run(mode, x, xq, *ws[0], t).float()
                err = ((got - ref).abs().max() / ref.abs().max()).item()
                if not err < 1e-2:
                    line += " %s FAIL (relative error %.3g)" % (mode, err)
                    continue
            us = bench(lambda i: run(mode, x, xq, *ws[i], t), nw_)
            line += " %s %.2f us (%.0f GB/s)" % (mode, us, n * k / 2 / us / 1e3)
        line += "; int4_linear %.2f us" % bench(lambda i: qt.int4_linear(x, *ws[i], 128, tiles=t), nw_)
        print(line, flush=True)
        del ws
        torch.cuda.empty_cache()

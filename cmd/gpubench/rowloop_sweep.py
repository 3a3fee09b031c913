"""Times one-row products (a decode step at one token) on the GPU, each
kind of weight and each way the worker can run it, over the projection
shapes of llama1b and llama8b:

- bfloat16 weights through cuBLAS (F.linear) and through the row loop
  with unit scales (quant_triton.fp8_linear, quant.ROW_LOOP) at
  candidate tiles;
- FP8 (128x128 blocks) through the row loop;
- for qkv and gate_up: add_rms then the product, against the residual
  add and RMSNorm inside it (quant_triton.fp8_norm_linear) at candidate
  tiles, bfloat16 and FP8;
- for down: silu_mul then the product, against SwiGLU inside it;
- lm_head: the output projection of the 1B and 8B shapes (hidden 2,048
  and 4,096, vocabulary 128,256), cuBLAS against the row loop and the
  final norm inside it;
- fp8tiles-S: shape S's FP8 products in the row loop over a grid of
  tiles (columns, warps, K tile, K split target), the best eight beside
  today's tile.

    python3 cmd/gpubench/rowloop_sweep.py RUNTIME_DIR [1b] [8b] [lm_head] [fp8tiles-1b] [fp8tiles-8b]

Each product runs inside a CUDA graph of 20 launches (PDL edges between
them where the kernels take it, as in decode), timed by CUDA events over
30 replays, best of 5; the weights rotate over copies that together
exceed L2, so each launch streams its weight from memory. Figures:
microseconds a product and the bfloat16 weight's bytes over that time.
One product's time alone misses what a step gains from launching behind
the kernel before (pdl.py): the decode figures (gpubench) decide.
"""
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, sys.argv[1])
from mlxsworker.torchrt import kernels, quant_triton as qt  # noqa: E402
from mlxsworker.torchrt.quant import WHOLE  # noqa: E402
from mlxsworker.torchrt.quant_triton import Tiles  # noqa: E402

dev = torch.device("cuda")
one = torch.ones(1, 1, device=dev)


def bench(fn, n_w, reps=20, iters=30):
    for i in range(n_w):
        fn(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for r in range(reps):
            fn(r % n_w)
    g.replay()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(iters):
            g.replay()
        e1.record()
        e1.synchronize()
        best = min(best, e0.elapsed_time(e1) * 1000 / (iters * reps))
    return best


SHAPES = {"1b": [("qkv", 3072, 2048), ("o", 2048, 2048), ("gate_up", 16384, 2048), ("down", 2048, 8192)],
          "8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]}
VARIANTS = [Tiles(1, 64, 2, 2, 8, gemv=True, bk=128), Tiles(1, 64, 2, 2, 8, gemv=True, bk=64),
            Tiles(1, 64, 4, 2, 8, gemv=True, bk=128), Tiles(1, 128, 4, 2, 8, gemv=True, bk=64),
            Tiles(1, 32, 2, 2, 8, gemv=True, bk=128), Tiles(1, 64, 2, 3, 8, gemv=True, bk=64),
            Tiles(1, 64, 2, 2, 4, gemv=True, bk=128)]


def lm_head(k, n=128256):
    """The output projection at one row ([vocab, hidden] bfloat16, one
    weight already past L2): cuBLAS as Decoder.logits runs it (then
    float32), against the row loop and the final norm inside it."""
    ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5 for _ in range(2)]
    x, dd = (torch.randn(1, k, device=dev, dtype=torch.bfloat16) for _ in range(2))
    lnw = torch.rand(k, device=dev, dtype=torch.bfloat16) + 0.5
    res = {"cublas": bench(lambda i: F.linear(x, ws[i]), 2),
           "cublas+float": bench(lambda i: F.linear(x, ws[i]).float(), 2),
           "add_rms+cublas+float": bench(lambda i: F.linear(kernels.add_rms(x, dd, lnw, 1e-5)[1], ws[i]).float(), 2)}
    for t in [None] + VARIANTS:
        res["rowloop %r" % (t,)] = bench(lambda i: qt.fp8_linear(x, ws[i], one, WHOLE, tiles=t), 2)
        res["fused norm %r" % (t,)] = bench(lambda i: qt.fp8_norm_linear(x, dd, lnw, 1e-5, False, ws[i], one, WHOLE, tiles=t), 2)
    print("== lm_head [%d, %d] (bf16 %.0f MB)" % (n, k, n * k * 2 / 1e6), flush=True)
    for key, v in res.items():
        print("  %-58s %.2f us  %.0f GB/s(bf16)" % (key, v, n * k * 2 / v / 1e3), flush=True)
    del ws
    torch.cuda.empty_cache()


def fp8_tiles(shape):
    """FP8 (128x128 blocks) one-row products of a shape at every tile of a
    grid (columns, warps, K tile, waves: the K split's target), beside
    the tile quant_triton.tiles_for gives one row today, best first."""
    grid = [Tiles(1, bn, warps, 2, waves, gemv=True, bk=bk) for bn in (32, 64, 128) for warps in (2, 4)
            for bk in (128, 256) for waves in (2, 4, 8, 16)]
    for name, n, k in SHAPES[shape]:
        nw_ = max(2, -(-(256 << 20) // (n * k)))
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        w8 = [(torch.randn(n, k, device=dev) * 40 / k ** 0.5).clamp(-448, 448).to(torch.float8_e4m3fn) for _ in range(nw_)]
        sb = torch.rand(-(-n // 128), -(-k // 128), device=dev) * 0.01
        res = {"today": bench(lambda i: qt.fp8_linear(x, w8[i], sb, (128, 128)), nw_)}
        for t in grid:
            try:
                res[repr(t)] = bench(lambda i: qt.fp8_linear(x, w8[i], sb, (128, 128), tiles=t), nw_)
            except Exception as e:  # a tile Triton cannot compile (registers, shared memory)
                print("  %r: %s" % (t, repr(e)[:80]), flush=True)
        print("== %s %s FP8 [%d, %d] (%.1f MB): tiles, best first" % (shape, name, n, k, n * k / 1e6), flush=True)
        for key, v in sorted(res.items(), key=lambda kv: kv[1])[:8] + [("today", res["today"])]:
            print("  %-58s %.2f us  %.0f GB/s" % (key, v, n * k / v / 1e3), flush=True)
        del w8
        torch.cuda.empty_cache()


for shape in sys.argv[2:] or ["1b", "8b"]:
    if shape.startswith("fp8tiles"):  # fp8tiles-1b, fp8tiles-8b
        fp8_tiles(shape.split("-", 1)[1])
        continue
    if shape == "lm_head":
        lm_head(2048)
        lm_head(4096)
        continue
    for name, n, k in SHAPES[shape]:
        nw_ = max(2, -(-(256 << 20) // (n * k * 2)))
        kin = 2 * k if name == "down" else k
        x = torch.randn(1, kin, device=dev, dtype=torch.bfloat16)
        dd = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        lnw = torch.rand(k, device=dev, dtype=torch.bfloat16) + 0.5
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5 for _ in range(nw_)]
        w8 = [(w.float() * 40).clamp(-448, 448).to(torch.float8_e4m3fn) for w in ws[:max(2, nw_ // 2)]]
        sb = torch.rand(-(-n // 128), -(-k // 128), device=dev) * 0.01
        res = {}
        xk = x[:, :k].contiguous()
        if name == "down":
            res["bf16 silu_mul+cublas"] = bench(lambda i: F.linear(kernels.silu_mul(x), ws[i]), nw_)
            res["bf16 rowloop silu"] = bench(lambda i: qt.fp8_linear(x, ws[i], one, WHOLE, silu=True), nw_)
            res["fp8 rowloop silu"] = bench(lambda i: qt.fp8_linear(x, w8[i], sb, (128, 128), silu=True), len(w8))
            res["fp8 silu_mul+rowloop"] = bench(lambda i: qt.fp8_linear(kernels.silu_mul(x), w8[i], sb, (128, 128)), len(w8))
        res["bf16 cublas"] = bench(lambda i: F.linear(xk, ws[i]), nw_)
        for t in VARIANTS:
            try:
                res["bf16 rowloop %r" % t] = bench(lambda i: qt.fp8_linear(xk, ws[i], one, WHOLE, tiles=t), nw_)
            except Exception as e:
                res["bf16 rowloop %r" % t] = repr(e)[:80]
        res["fp8 rowloop"] = bench(lambda i: qt.fp8_linear(xk, w8[i], sb, (128, 128)), len(w8))
        if name in ("qkv", "gate_up"):
            res["bf16 add_rms+cublas"] = bench(lambda i: F.linear(kernels.add_rms(xk, dd, lnw, 1e-5)[1], ws[i]), nw_)
            for t in VARIANTS[:4]:
                res["bf16 fused %r" % t] = bench(lambda i: qt.fp8_norm_linear(xk, dd, lnw, 1e-5, False, ws[i], one, WHOLE, tiles=t), nw_)
            res["fp8 add_rms+rowloop"] = bench(lambda i: qt.fp8_linear(kernels.add_rms(xk, dd, lnw, 1e-5)[1], w8[i], sb, (128, 128)), len(w8))
            for t in VARIANTS[:4]:
                res["fp8 fused %r" % t] = bench(lambda i: qt.fp8_norm_linear(xk, dd, lnw, 1e-5, False, w8[i], sb, (128, 128), tiles=t), len(w8))
        print("== %s %s [%d, %d] (bf16 %.1f MB)" % (shape, name, n, k, n * k * 2 / 1e6), flush=True)
        for key, v in res.items():
            print("  %-58s %s" % (key, ("%.2f us  %.0f GB/s(bf16)" % (v, n * k * 2 / v / 1e3)) if isinstance(v, float) else v), flush=True)
        del ws, w8
        torch.cuda.empty_cache()

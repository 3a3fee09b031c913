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
- fp8tiles-S: shape S's one-row FP8 products as decode runs them (the
  norm inside q/k/v and where quant.norm_fits takes gate/up, SwiGLU
  inside down) over a grid of tiles (columns, warps, K tile, K split
  target), the best eight beside today's tile; w16tiles-S the same for
  bfloat16 weights in the row loop, int4tiles-S for int4 through the
  fast row loop, int4h2tiles-S through the packed one (under
  MLXSERVING_INT4_H2=0: beside the unpacked loop), mmatiles-S for fp8_mma
  at 64 rows, mmatma-S for it with the weight (and its input) through TMA
  (mmatma-S@16 and @32: at those rows)
  (fp8tiles-8b.gate_up: that product alone); fp8wide-S and w16wide-S
  the grids of K tiles 256 and 512 wide (over two and four FP8 scale
  blocks); int4mma-S int4's tensor-core tile at one row.
  Where a grid's best beats today's by more than 2%, the end prints the
  MLXSERVING_TILES line that runs it (tile_table.SHAPE_TILES), for an
  end-to-end A/B on one binary.

    python3 cmd/gpubench/rowloop_sweep.py RUNTIME_DIR [1b] [8b] [lm_head] [fp8tiles-S] [w16tiles-S] [int4tiles-S]
        [int4h2tiles-S] [mmatiles-S] [mmatma-S[@ROWS]] [fp8wide-S] [w16wide-S] [int4mma-S]

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
from mlxsworker.torchrt import kernels, quant_triton as qt, tile_table  # noqa: E402
from mlxsworker.torchrt.quant import WHOLE  # noqa: E402
from mlxsworker.torchrt.quant_triton import Tiles  # noqa: E402
from rowbench import SHAPES, bench  # noqa: E402  (this script's folder)

dev = torch.device("cuda")
one = torch.ones(1, 1, device=dev)
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


def products(shape):
    """SHAPES[shape], or the one product of "8b.gate_up"."""
    shape, _, only = shape.partition(".")
    return [p for p in SHAPES[shape] if not only or p[0] == only]


def _grid_best(label, n, k, nbytes, today, cands, fn, nw_, kind, rows):
    """Times fn(i, tile) at today's tile and each candidate, prints the
    best eight beside today's, and keeps a tile_table.SHAPE_TILES entry
    where the best, timed again beside today's (alternating, three
    rounds, medians), beats it by more than 2%. A candidate whose
    product is further than 1% (of the largest output) from today's is
    refused; one equal to today's is not timed twice."""
    def out(r):  # fp8_norm_linear returns (residual, product)
        return (r[1] if isinstance(r, tuple) else r).float()

    res = {"today %r" % today: bench(lambda i: fn(i, None), nw_)}
    want = out(fn(0, None))
    tiles = {}
    for t in cands:
        if repr(t) == repr(today):
            continue
        try:
            e = ((out(fn(0, t)) - want).abs().max() / want.abs().max()).item()
            if not e < 1e-2:
                print("  %r: FAIL, relative error %.3g against today's tile" % (t, e), flush=True)
                continue
            res[repr(t)] = bench(lambda i: fn(i, t), nw_)
            tiles[repr(t)] = t
        except Exception as e:  # a tile Triton cannot compile (registers, shared memory)
            print("  %r: %s" % (t, repr(e)[:80]), flush=True)
    print("== %s [%d, %d] (%.1f MB): tiles, best first" % (label, n, k, nbytes / 1e6), flush=True)
    ranked = sorted(res.items(), key=lambda kv: kv[1])
    base = res["today %r" % today]
    for key, v in ranked[:8] + [r for r in ranked[8:] if r[0].startswith("today")]:
        print("  %-58s %.2f us  %.0f GB/s" % (key, v, nbytes / v / 1e3), flush=True)
    best = next((kv for kv in ranked if kv[0] in tiles), None)
    if best is None or best[1] >= base * 0.98:
        return
    t = tiles[best[0]]
    again = {"today": [], "best": []}
    for _ in range(3):
        again["today"].append(bench(lambda i: fn(i, None), nw_))
        again["best"].append(bench(lambda i: fn(i, t), nw_))
    base, best = (sorted(again[key])[1] for key in ("today", "best"))
    print("  again, alternating: today's %.2f us, %r %.2f us" % (base, t, best), flush=True)
    if best < base * 0.98:
        fields = ["bm%d" % t.bm] if kind == "mma" else []
        fields += ["bn%d" % t.bn, "w%d" % t.warps, "s%d" % t.stages, "waves%d" % t.waves]
        fields += ["bk%d" % t.bk] if t.bk else []
        fields += (["swap" if t.swap else "noswap", ("notma", "tma", "tma2")[t.tma]] if kind == "mma" else [])
        fields += (["h2" if t.h2 else "noh2"] if kind == "int4fast" else [])
        ENTRIES.append("%s:%d:%dx%d=%s" % (kind, rows, n, k, " ".join(fields)))
        print("ENTRY %s  (%.2fx today's)" % (ENTRIES[-1], base / best), flush=True)


# SHAPE_TILES entries the grids found, printed at the end as MLXSERVING_TILES.
ENTRIES = []


def fp8_tiles(shape, w16=False, wide=False):
    """FP8 (128x128 blocks) one-row products of a shape as decode runs
    them (q/k/v, and gate/up where quant.norm_fits takes it, with the
    residual add and RMSNorm inside; down with SwiGLU inside) at every
    tile of a grid (columns, warps, K tile within a scale block, waves:
    the K split's target), beside today's tile. w16: bfloat16 weights
    through the same row loop with unit scales (quant.ROW_LOOP), as
    bf16 checkpoints decode. wide: the grid of K tiles over whole scale
    blocks (256 and 512 inputs: two and four of FP8's, quant_triton's
    NB)."""
    from mlxsworker.torchrt import quant
    if wide:
        grid = [Tiles(1, bn, warps, stages, waves, gemv=True, bk=bk) for bn in (16, 32, 64, 128)
                for warps in (2, 4, 8) for bk in (256, 512) for stages in (2,) for waves in (4, 8, 16)
                if 64 <= bn * bk // (32 * warps) <= 256]
    else:
        grid = [Tiles(1, bn, warps, 2, waves, gemv=True, bk=bk) for bn in (16, 32, 64, 128) for warps in (1, 2, 4)
                for bk in (64, 128) for waves in (2, 4, 8, 16) if bn * bk // (32 * warps) <= 256]
    pre = "w16" if w16 else "fp8"
    for name, n, k in products(shape):
        nw_ = max(2, -(-(256 << 20) // (n * k * (2 if w16 else 1))))
        if w16:
            ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5 for _ in range(nw_)]
            sb, block = one, WHOLE
        else:
            ws = [(torch.randn(n, k, device=dev) * 40 / k ** 0.5).clamp(-448, 448).to(torch.float8_e4m3fn)
                  for _ in range(nw_)]
            sb, block = torch.rand(-(-n // 128), -(-k // 128), device=dev) * 0.01, (128, 128)
        x = torch.randn(1, 2 * k if name == "down" else k, device=dev, dtype=torch.bfloat16)
        dd = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        lnw = torch.rand(k, device=dev, dtype=torch.bfloat16) + 0.5
        norm = name in ("qkv", "gate_up") and quant.NORM_FUSE and quant.norm_fits(ws[0], k)
        if norm:
            kind, today = pre + "norm", qt.shaped(qt.NORM_TILES, pre + "norm", 1, n, k)
            fn = lambda i, t: qt.fp8_norm_linear(x, dd, lnw, 1e-5, False, ws[i], sb, block, tiles=t)  # noqa: E731
        else:
            kind, today = pre, qt.tiles_for(1, pre, n, K=k)
            fn = lambda i, t: qt.fp8_linear(x, ws[i], sb, block, tiles=t, silu=name == "down")  # noqa: E731
        how = " (norm inside)" if norm else " (SwiGLU inside)" if name == "down" else ""
        _grid_best("%s %s %s%s" % (shape, name, "bf16" if w16 else "FP8", how), n, k, n * k * (2 if w16 else 1),
                   today, grid, fn, nw_, kind, 1)
        del ws
        torch.cuda.empty_cache()


def int4_tiles(shape, h2=False, mma=False):
    """int4 (GPTQ, groups of 128) one-row products of a shape through the
    fast row loop (quant_triton.INT4_FAST) at every tile of a grid
    (columns, warps, K tile, waves), beside today's tile; h2: the packed
    row loop's grid (quant_triton.INT4_H2; beside the unpacked loop under
    MLXSERVING_INT4_H2=0); mma: the fast tensor-core tile
    (_int4_dot2_kernel, the row on the MMA's narrow side) at one row."""
    from mlxsworker.torchrt import quant
    if mma:
        grid = [Tiles(16, bn, 4, stages, waves, bk=bk, swap=True, fast=True) for bn in (32, 64, 128, 256)
                for bk in (64, 128) for stages in (3, 4) for waves in (1, 2, 4, 8)]
    elif h2:  # a [columns, K tile / 8] tile of words, 4 to 64 words a thread; down to one program an SM and
        # no K split (waves 1), its loads in flight through the pipeliner's stages instead
        grid = [Tiles(1, bn, warps, stages, waves, gemv=True, bk=128, fast=True, h2=True) for bn in (32, 64, 128)
                for warps in (2, 4, 8) for stages in (1, 2, 3, 4) for waves in (1, 2, 4, 8, 16)
                if 4 <= bn * 16 // (32 * warps) <= 64]
    else:
        grid = [Tiles(1, bn, warps, 1, waves, gemv=True, bk=bk, fast=True) for bn in (128, 256, 512, 1024)
                for warps in (2, 4, 8) for bk in (32, 64, 128) for waves in (4, 8, 16) if 1 <= bn // (32 * warps) <= 8]
    for name, n, k in products(shape):
        nw_ = max(2, -(-(256 << 20) // (n * k // 2)))
        ws = []
        for _ in range(nw_):
            q = torch.randint(0, 16, (k, n), device=dev, dtype=torch.int32)
            ws.append((quant.pack4(q), (torch.rand(k // 128, n, device=dev) * 0.01).bfloat16(),
                       torch.full((k // 128, n), 8.0, device=dev).half()))
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        fn = lambda i, t: qt.int4_linear(x, *ws[i], 128, tiles=t)  # noqa: E731
        _grid_best("%s %s int4" % (shape, name), n, k, n * k // 2, qt.tiles_for(1, "int4", n, K=k), grid, fn, nw_,
                   "int4fast" if qt.INT4_FAST else "int4", 1)
        del ws
        torch.cuda.empty_cache()


def mma_tiles(shape, M=64, tma=False):
    """FP8 W8A8 products (quant_triton.fp8_mma) of a shape at M rows (a
    decode step of M sequences) at every tile of a grid, beside today's;
    the activations' codes handed over (quant_triton.give), as the
    decoder's add_rms and silu_mul hand them over from 17 rows, so no
    act_quant launch is timed. tma: the grid of tiles whose weight
    streams through a TMA descriptor (quant_triton.FP8_TMA), deeper
    pipelines and wider tiles among them."""
    if tma:  # the rows' tile height, tokens on the narrow side below 64; up to 16 rows quantized in the kernel too
        bm, pres = (16, (False, True)) if M <= 16 else (32, (True,)) if M <= 32 else (64, (True,))
        grid = [Tiles(bm, bn, warps, stages, waves, swap=swap, pre=pre, tma=tma) for pre in pres
                for bn in (64, 128, 256) for warps in (4, 8) for stages in (3, 4, 5, 6) for waves in (1, 2, 4, 8)
                for swap in (False, True) for tma in (1, 2)
                if bn * 128 * stages <= 160 << 10 and not (swap and bn == 256) and not (tma == 2 and not pre)
                and not (bm < 64 and not swap)]
    else:
        grid = [Tiles(bm, bn, warps, stages, waves, swap=swap, pre=True) for bm in (32, 64) for bn in (32, 64, 128)
                for warps in (4, 8) for stages in (3, 4) for waves in (1, 2, 4) for swap in (False, True)
                if not (bm < 64 and not swap) and not (bn == 32 and warps == 8)]
    for name, n, k in products(shape):
        nw_ = max(2, -(-(256 << 20) // (n * k)))
        w8 = [(torch.randn(n, k, device=dev) * 40 / k ** 0.5).clamp(-448, 448).to(torch.float8_e4m3fn) for _ in range(nw_)]
        sb = torch.rand(-(-n // 128), -(-k // 128), device=dev) * 0.01
        x = torch.randn(M, k, device=dev, dtype=torch.bfloat16)
        codes = qt.act_quant(x, qt.ACT_GROUP)

        def fn(i, t):
            qt.give(x, *codes)
            return qt.fp8_mma(x, w8[i], sb, (128, 128), tiles=t)
        _grid_best("%s %s FP8 mma %d rows" % (shape, name, M), n, k, n * k, qt.tiles_for(M, "mma", n, K=k), grid,
                   fn, nw_, "mma", tile_table.rows_bucket(M))
        del w8
        torch.cuda.empty_cache()


for shape in sys.argv[2:] or ["1b", "8b"]:
    grids = {"fp8tiles": fp8_tiles, "w16tiles": lambda sh: fp8_tiles(sh, True),
             "fp8wide": lambda sh: fp8_tiles(sh, wide=True), "w16wide": lambda sh: fp8_tiles(sh, True, True),
             "int4tiles": int4_tiles,
             "int4h2tiles": lambda sh: int4_tiles(sh, True), "int4mma": lambda sh: int4_tiles(sh, mma=True),
             "mmatiles": mma_tiles,
             "mmatma": lambda sh, M=64: mma_tiles(sh, M, tma=True)}
    grid, _, of = shape.partition("-")
    of, _, rows = of.partition("@")  # mmatma-8b@32: the mma grids at another row count
    if grid in grids:  # fp8tiles-1b, int4tiles-8b, mmatiles-8b
        if of.partition(".")[0] not in SHAPES or rows and (grid != "mmatma" or int(rows) not in (16, 32, 64)):
            raise SystemExit("%s: want %s-S with S one of %s (mmatma-S@ROWS: 16, 32 or 64)"
                             % (shape, grid, ", ".join(SHAPES)))
        grids[grid](of, int(rows)) if rows else grids[grid](of)
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

if ENTRIES:
    print("MLXSERVING_TILES=%s" % "; ".join(ENTRIES), flush=True)

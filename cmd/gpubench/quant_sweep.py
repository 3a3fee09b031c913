"""Times the quantized GEMMs (the worker's torchrt/quant_triton.py) on the
GPU against bf16 cuBLAS, over the projection shapes of the llama1b and
llama8b shapes and the row counts decode and prompt steps use: the table
quant_triton's tiles_for reads comes from this.

    python3 cmd/gpubench/quant_sweep.py [--old PATH] [--rows 1,16,64,256,2048] [--sweep] [--w8a8-rows 16,64,256]
        [--int4-fast-rows 1,2,16,64] [--gemv-stages 2,3,4]

Every product runs inside a CUDA graph of 20 launches (as the decode
steps run), timed by CUDA events over 5 replays; figures are microseconds
a product and the weight's bytes over that time (GB/s). --old times
another quant_triton.py beside it (the build before); --sweep tries
every candidate tile for the decode rows and prints the best. Each
candidate is first checked against the dequantized product.

Then the FP8 products as W8A8 (quant_triton.fp8_w8a8: the activations
quantized per token, torch._scaled_mm) at --w8a8-rows, for 128x128 block
weights (through torch._scaled_mm and torch.nn.functional.scaled_mm) and
per-channel ones, beside bf16 cuBLAS and the weight-only path quant.py
takes at that row count (the Triton tile, or dequantize + cuBLAS from
DEQUANT_ROWS), and the activation quantizer alone: w8a8.MIN_ROWS is the
fewest rows where W8A8 wins.

--int4-fast-rows: the int4 products through quant_triton's fast kernels
(INT4_FAST: the magic-number row loop and the tensor-core tile of 16-bit
codes) beside the kernels they would replace, on random nibbles, scales
and zeros: each checked against the float32 product of the dequantized
weight (bfloat16 x, and float16 x for the error alone), a failure printed
as a FAIL line and the table going on; with --sweep, the fast kernels'
candidate tiles too. The fast kernels alone, with no other table:

    python3 cmd/gpubench/quant_sweep.py --kinds int4 --rows "" --w8a8-rows "" --int4-fast-rows 1,2,16,64
"""
import argparse
import importlib.util
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "engine", "pyproc", "runtime"))
from mlxsworker.torchrt import quant, quant_triton as qt, w8a8  # noqa: E402

SHAPES = {  # (N, K) of each projection, q/k/v and gate/up fused as the loader fuses them
    "1b.qkv": (3072, 2048), "1b.o": (2048, 2048), "1b.gate_up": (16384, 2048), "1b.down": (2048, 8192),
    "8b.qkv": (6144, 4096), "8b.o": (4096, 4096), "8b.gate_up": (28672, 4096), "8b.down": (4096, 14336),
}


def weights(kind, N, K, dev):
    gen = torch.Generator(device="cpu").manual_seed(N * 7 + K)
    if kind == "fp8":
        w = (torch.randn(N, K, generator=gen) * 0.05).clamp(-448, 448).to(torch.float8_e4m3fn)
        s = torch.rand(-(-N // 128), -(-K // 128), generator=gen) * 0.01 + 0.001
        return quant.QWeight("fp8", N, K, w=w.to(dev), scale=s.to(dev), block=(128, 128))
    q = torch.randint(0, 16, (K, N), generator=gen, dtype=torch.int32)
    sc = (torch.rand(K // 128, N, generator=gen) * 0.02).half()
    z = torch.full((K // 128, N), 8.0).half()
    return quant.QWeight("int4", N, K, qw=quant.pack4(q).to(dev), scales=sc.to(dev), zeros=z.to(dev), group=128)


def call(mod, qw, x, **kw):
    t = qw.t
    if qw.kind == "fp8":
        return mod.fp8_linear(x, t["w"], t["scale"], t["block"], **kw)
    return mod.int4_linear(x, t["qw"], t["scales"], t["zeros"], t["group"], **kw)


def timed(fn, reps=20, replays=5):
    """Microseconds per call of fn, replayed from a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(replays):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1000 / (reps * replays)


def err(got, want):
    return (got.float() - want).abs().max().item() / (want.abs().max().item() + 1e-6)


# The row loop's pipeline depths a sweep tries (--gemv-stages).
STAGES = (2,)


def candidates(M):
    if M <= 4:  # the row-loop kernel, BLOCK_M rows
        bm = 1 << (M - 1).bit_length()
        for bn, warps, waves, bk, stages in itertools.product((32, 64, 128, 256, 512), (1, 2, 4), (2, 4, 8), (64, 128),
                                                              STAGES):
            yield qt.Tiles(bm, bn, warps, stages, waves, gemv=True, bk=bk)
        return
    bm = 16 if M <= 16 else 32 if M <= 32 else 64
    for bn, warps, stages, waves in itertools.product((32, 64, 128), (4, 8), (3, 4), (1, 2, 4)):
        yield qt.Tiles(bm, bn, warps, stages, waves)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", help="another quant_triton.py to time beside this one")
    ap.add_argument("--rows", default="1,2,4,8,16,64,256,2048")
    ap.add_argument("--kinds", default="fp8,int4")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--w8a8-rows", default="16,32,64,128,256", help="rows of the W8A8 table; empty: none")
    ap.add_argument("--mma-rows", default="", help="rows of the fp8_mma table (with --sweep: its tiles); empty: none")
    ap.add_argument("--int4-fast-rows", default="", help="rows of the fast int4 kernels' table; empty: none")
    ap.add_argument("--gemv-stages", default="2", help="the row loops' pipeline depths --sweep tries")
    a = ap.parse_args()
    global STAGES
    STAGES = tuple(ints(a.gemv_stages))
    dev = torch.device("cuda")
    old = None
    if a.old:
        spec = importlib.util.spec_from_file_location("mlxsworker.torchrt.quant_triton_old", a.old)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__)
    best_by = {}  # (kind, M) -> {repr(tiles): sum of time / best time over shapes}
    for kind in a.kinds.split(",") if ints(a.rows) else ():
        print("\n| %s | rows | bf16 us | old us | new us | new GB/s | new/bf16 speed | dequant+mm us | best tile | best us |" % kind)
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, (N, K) in SHAPES.items():
            qw = weights(kind, N, K, dev)
            wb = qw.dequant(torch.bfloat16)
            nbytes = qw.nbytes()
            for M in ints(a.rows):
                x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
                want = x.float() @ wb.float().t()
                t_bf = timed(lambda: x @ wb.t())
                t_old = "-"
                if old is not None:
                    if err(call(old, qw, x), want) > 2e-2:
                        t_old = "wrong"
                    else:
                        t_old = "%.1f" % timed(lambda: call(old, qw, x))
                e = err(call(qt, qw, x), want)
                t_new = timed(lambda: call(qt, qw, x)) if e <= 2e-2 else float("nan")
                t_dq = timed(lambda: call(qt, qw, x, dequant_rows=1))
                best, best_t = "-", float("nan")
                if a.sweep and M <= 64:
                    best, best_t = sweep(candidates(M), lambda tl_: call(qt, qw, x, tiles=tl_, dequant_rows=1 << 30),
                                         want, lambda e: e <= 2e-2, best_by.setdefault((kind, M), {}),
                                         "%s %s M=%d" % (kind, name, M))
                print("| %s | %d | %.1f | %s | %.1f%s | %.0f | %.2fx | %.1f | %s | %.1f |" % (
                    name, M, t_bf, t_old, t_new, "" if e <= 2e-2 else " (err %.3g)" % e, nbytes / t_new / 1e3,
                    t_bf / t_new, t_dq, best, best_t))
                sys.stdout.flush()
    if a.w8a8_rows and "fp8" in a.kinds.split(","):
        w8a8_table([int(r) for r in a.w8a8_rows.split(",")], dev)
    if a.mma_rows:
        mma_table([int(r) for r in a.mma_rows.split(",")], dev, a.sweep, best_by)
    if a.int4_fast_rows:
        int4_fast_table(ints(a.int4_fast_rows), dev, a.sweep, best_by)
    if best_by:
        print("\nTiles by rows (sum over shapes of time / that shape's best; lower is better, %d shapes):" % len(SHAPES))
        for (kind, M), acc in sorted(best_by.items()):
            top = sorted(acc.items(), key=lambda kv: kv[1])[:5]
            print("%s M=%d: %s" % (kind, M, "; ".join("%s %.2f" % kv for kv in top)))


def ints(csv):
    return [int(r) for r in csv.split(",") if r.strip()]


def int4_random(N, K, dev):
    """An int4 QWeight with random nibbles, scales and (integer) zeros, as
    quant_triton.self_check builds them."""
    gen = torch.Generator(device="cpu").manual_seed(N * 5 + K)
    q = torch.randint(0, 16, (K, N), generator=gen, dtype=torch.int32)
    sc = (torch.rand(K // 128, N, generator=gen) * 0.02 + 0.001).half()
    z = torch.randint(0, 16, (K // 128, N), generator=gen).half()
    return quant.QWeight("int4", N, K, qw=quant.pack4(q).to(dev), scales=sc.to(dev), zeros=z.to(dev), group=128)


def checked(what, fn, want, tol=2e-2):
    """(relative error, microseconds) of fn, timed only where its error is
    under tol; a failure or an exception is printed as a FAIL line and
    gives NaN microseconds."""
    try:
        e = err(fn(), want)
    except Exception as ex:  # a compile or launch failure: report and go on
        print("FAIL %s: %s" % (what, str(ex).strip().splitlines()[-1][:300] if str(ex).strip() else repr(ex)))
        return float("nan"), float("nan")
    if not e <= tol:
        print("FAIL %s: relative error %.3g (tolerance %.3g)" % (what, e, tol))
        return e, float("nan")
    try:
        return e, timed(fn)
    except Exception as ex:  # graph capture
        print("FAIL %s (timing): %s" % (what, str(ex).strip().splitlines()[-1][:300]))
        return e, float("nan")


def int4_fast_candidates(M):
    if M == 1:  # the row loop: 1 to 8 words a thread
        for bn, warps, waves, bk in itertools.product((64, 128, 256, 512, 1024), (1, 2, 4, 8), (4, 8), (64, 128)):
            if 1 <= bn // (32 * warps) <= 8:
                for stages in sorted({1} | set(STAGES)):
                    yield qt.Tiles(1, bn, warps, stages, waves, gemv=True, bk=bk, fast=True)
        return
    bm = 16 if M <= 16 else 32 if M <= 32 else 64
    for bn, stages, waves, swap, bk in itertools.product((64, 128), (3, 4), (2, 4), (True, False), (64, 128)):
        yield qt.Tiles(bm, bn, 4, stages, waves, bk=bk, swap=swap, fast=True)


def int4_fast_table(rows, dev, do_sweep, best_by):
    """The fast int4 kernels beside the ones INT4_FAST replaces and bf16
    cuBLAS, per projection and row count; errors relative to the output's
    largest magnitude."""
    print("\n| int4 fast | rows | bf16 us | old us | old GB/s | fast us | fast GB/s | fast/old speed | fast/bf16 speed "
          "| old err | fast err | fast fp16 err | fast tile | best fast tile | best us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, (N, K) in SHAPES.items():
        qw = int4_random(N, K, dev)
        wd = qw.dequant(torch.float32)
        wb = wd.to(torch.bfloat16)
        nbytes = qw.nbytes()
        for M in rows:
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            want = x.float() @ wd.t()
            t_bf = timed(lambda: x @ wb.t())
            t_old, t_new = qt.tiles_for(M, "int4", N, False), qt.tiles_for(M, "int4", N, True)
            e_old, us_old = checked("int4 old %s M=%d %r" % (name, M, t_old),
                                    lambda: call(qt, qw, x, tiles=t_old, dequant_rows=1 << 30), want)
            e_new, us_new = checked("int4 fast %s M=%d %r" % (name, M, t_new),
                                    lambda: call(qt, qw, x, tiles=t_new, dequant_rows=1 << 30), want)
            xh = x.half()
            try:
                e_h = err(call(qt, qw, xh, tiles=t_new, dequant_rows=1 << 30), xh.float() @ wd.t())
                if not e_h <= 2e-2:
                    print("FAIL int4 fast fp16 %s M=%d %r: relative error %.3g" % (name, M, t_new, e_h))
            except Exception as ex:
                e_h = float("nan")
                print("FAIL int4 fast fp16 %s M=%d: %s" % (name, M, str(ex).strip().splitlines()[-1][:300]))
            best, best_t = "-", float("nan")
            if do_sweep:
                best, best_t = sweep(int4_fast_candidates(M),
                                     lambda tl_: call(qt, qw, x, tiles=tl_, dequant_rows=1 << 30), want,
                                     lambda e: e <= 2e-2, best_by.setdefault(("int4-fast", M), {}),
                                     "int4 fast %s M=%d" % (name, M))
            print("| %s | %d | %.1f | %.1f | %.0f | %.1f | %.0f | %.2fx | %.2fx | %.2g | %.2g | %.2g | %r | %s | %.1f |" % (
                name, M, t_bf, us_old, nbytes / us_old / 1e3, us_new, nbytes / us_new / 1e3, us_old / us_new,
                t_bf / us_new, e_old, e_new, e_h, t_new, best, best_t))
            sys.stdout.flush()


def sweep(cands, product, want, good, acc, what):
    """Times product(tiles) for each candidate whose result good(err)
    accepts and adds each one's time over the best to acc; returns the
    best tile's repr and microseconds ("-", NaN when none ran)."""
    times = {}
    for tl_ in cands:
        try:
            if not good(err(product(tl_), want)):
                continue
            times[repr(tl_)] = timed(lambda: product(tl_), reps=10, replays=3)
        except Exception as ex:  # out of shared memory and the like
            times[repr(tl_)] = float("inf")
            print("  %s %r: %s" % (what, tl_, str(ex).splitlines()[0][:120]), file=sys.stderr)
    if not times:
        return "-", float("nan")
    best = min(times, key=times.get)
    for k, v in times.items():
        acc[k] = acc.get(k, 0.0) + v / times[best]
    return best, times[best]


def fp8_pair(N, K, dev):
    """weights("fp8") with 128x128 block scales, and the same weight
    quantized per channel: the two FP8 layouts of a projection."""
    blk = weights("fp8", N, K, dev)
    wf = blk.dequant(torch.float32)
    s = wf.abs().amax(1, keepdim=True) / quant.E4M3_MAX
    return blk, quant.QWeight("fp8", N, K, w=(wf / s).clamp(-448, 448).to(torch.float8_e4m3fn), scale=s, block=(1, K))


def w8a8_table(rows, dev):
    """The W8A8 products beside bf16 and the weight-only path, per projection."""
    print("\n| fp8 W8A8 | rows | bf16 us | weight-only us | W8A8 block us | block v2 us | W8A8 channel us | act quant us "
          "| block/bf16 speed | block/weight-only speed |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, (N, K) in SHAPES.items():
        blk, chan = fp8_pair(N, K, dev)
        wf = blk.dequant(torch.float32)
        wb = blk.dequant(torch.bfloat16)
        cases = ((blk, wf, {}), (blk, wf, {"v2": True}), (chan, chan.dequant(torch.float32), {}))
        for M in rows:
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            t_bf = timed(lambda: x @ wb.t())
            t_wo = timed(lambda: call(qt, blk, x))
            cols = [w8a8_time(name, M, w, wd, x, how) for w, wd, how in cases]
            t_q = timed(lambda: qt.act_quant(x, 128, -(-M // 4) * 4))
            t_w = cols[0] if cols[0] == cols[0] else cols[1]  # the block product that ran
            print("| %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2fx | %.2fx |" % (
                name, M, t_bf, t_wo, *cols, t_q, t_bf / t_w, t_wo / t_w))
            sys.stdout.flush()


def mma_candidates(M):
    bms = [16] if M <= 16 else [16, 32] if M <= 32 else [32, 64] if M <= 64 else [64, 128]
    for bm, bn, warps, stages, waves, swap, pre in itertools.product(bms, (64, 128), (4,), (3, 4), (1, 2, 4),
                                                                     (True, False), (True, False)):
        if not swap and bm < 64 and M > 16:
            continue
        yield qt.Tiles(bm, bn, warps, stages, waves, swap=swap, pre=pre)


def mma_table(rows, dev, sweep, best_by):
    """quant_triton.fp8_mma (W8A8 in one Triton kernel) beside bf16 cuBLAS,
    the path quant.py takes today at that row count (the weight-only
    kernel, or W8A8 through cuBLAS from w8a8.MIN_ROWS) and cuBLAS's W8A8,
    for 128x128 block weights and per-channel ones; with sweep, every
    candidate tile and the best."""
    print("\n| fp8 mma | scales | rows | bf16 us | weight-only us | cuBLAS W8A8 us | mma us | mma GB/s | mma/bf16 speed "
          "| mma/weight-only speed | err vs dequant | best tile | best us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, (N, K) in SHAPES.items():
        blk, chan = fp8_pair(N, K, dev)
        for label, w in (("block", blk), ("channel", chan)):
            t = w.t
            wd = w.dequant(torch.float32)
            wb = wd.to(torch.bfloat16)
            for M in rows:
                x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
                want = x.float() @ wd.t()
                t_bf = timed(lambda: x @ wb.t())
                t_wo = timed(lambda: call(qt, w, x))
                t_cb = w8a8_time(name, M, w, wd, x, {}) if M >= 16 else float("nan")
                fn = lambda: qt.fp8_mma(x, t["w"], t["scale"], t["block"])  # noqa: E731
                try:
                    e = err(fn(), want)
                    t_m = timed(fn) if e < w8a8.TOLERANCE else float("nan")
                except Exception as ex:
                    print("  mma %s %s M=%d: %s" % (name, label, M, str(ex).splitlines()[0][:200]), file=sys.stderr)
                    e, t_m = float("nan"), float("nan")
                best, best_t = "-", float("nan")
                if sweep and label == "block":  # the channel layout runs the same tiles
                    best, best_t = sweep(mma_candidates(M),
                                         lambda tl_: qt.fp8_mma(x, t["w"], t["scale"], t["block"], tiles=tl_), want,
                                         lambda e: e < w8a8.TOLERANCE, best_by.setdefault(("mma-" + label, M), {}),
                                         "mma %s M=%d" % (name, M))
                print("| %s | %s | %d | %.1f | %.1f | %.1f | %.1f | %.0f | %.2fx | %.2fx | %.3g | %s | %.1f |" % (
                    name, label, M, t_bf, t_wo, t_cb, t_m, w.nbytes() / t_m / 1e3, t_bf / t_m, t_wo / t_m, e, best,
                    best_t))
                sys.stdout.flush()


def w8a8_time(name, M, w, wd, x, how):
    """Microseconds of one W8A8 product, NaN where it raises or is wrong."""
    t = w.t
    fn = lambda: qt.fp8_w8a8(x, t["w"], t["scale"], t["block"], **how)  # noqa: E731
    try:
        e = err(fn(), x.float() @ wd.t())
    except Exception as ex:  # this torch or GPU has no such product
        print("  %s M=%d %r %r: %s" % (name, M, t["block"], how, str(ex).splitlines()[0][:120]), file=sys.stderr)
        return float("nan")
    if e >= w8a8.TOLERANCE:
        print("  %s M=%d %r %r: relative error %.3g" % (name, M, t["block"], how, e), file=sys.stderr)
        return float("nan")
    return timed(fn)


if __name__ == "__main__":
    main()

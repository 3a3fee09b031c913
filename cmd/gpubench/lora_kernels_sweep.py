"""Times lora_triton's segmented kernels (lora.SegmentPlan) per projection
of the Llama-3.1-8B shape by rows and launch shape (lora_triton.PROGRAMS,
ROW_SLACK), rows spread over USED adapters of SLOTS rank-16 slots, each
projection's delta for 32 layers in one CUDA graph. Run on the GPU machine:

  python3 lora_kernels_sweep.py RUNTIME_DIR [SLOTS] [USED] [kernels|profile]

"kernels" times the kernels' tiles and warps instead of the launch
shapes; "profile" prints where the time goes instead: the shrink's and
the expand's GPU time (torch profiler, eager) at 1 and 64 rows.
"""
import os
import sys

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import lora_dense_cuda  # noqa: E402
from mlxsworker.torchrt import lora, lora_triton  # noqa: E402

SHAPE = dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336)
LAYERS = 32


def timed(fn):
    """µs a layer of a CUDA graph of fn (LAYERS projections)."""
    return lora_dense_cuda.timed(fn) * 1000 / LAYERS


def main():
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    used = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    dev = torch.device("cuda")
    s = lora_dense_cuda.segmented_slots(dict(SHAPE, layers=LAYERS), torch.bfloat16, n, 16, used)
    assert s is not None, "the segmented kernels do not run here"
    rows = (1, 16, 32, 64, 128)
    inputs = {}
    for N in rows:
        io = torch.tensor([1 + i % used for i in range(N)], device=dev)
        inputs[N] = io, {P: (torch.randn(N, w, device=dev, dtype=torch.bfloat16),
                             torch.zeros(N, sum(o for _, o in mods), device=dev, dtype=torch.bfloat16))
                         for P, (w, mods) in s.proj[0].items()}
    print("µs per layer, the four projections' deltas summed (qkv / o / gate_up / down)")
    launch = "profile" not in sys.argv and "kernels" not in sys.argv
    if launch:
        print("| PROGRAMS | ROW_SLACK | " + " | ".join("%d rows" % N for N in rows) + " |")
        print("|---|---|" + "---|" * len(rows))
    for programs in (256, 128, 64) if launch else ():
        for slack in (32, 8):
            lora_triton.PROGRAMS, lora_triton.ROW_SLACK = programs, slack
            cells = []
            for N in rows:
                io, xy = inputs[N]
                per = []
                with torch.no_grad():
                    for P, (x, y) in xy.items():
                        per.append(timed(lambda: [pl.add(y, x, li, P) for pl in [lora.SegmentPlan.of(s, io)] for li in range(LAYERS)]))
                cells.append("%.1f (%s)" % (sum(per), "/".join("%.0f" % v for v in per)))
            print("| %d | %d | %s |" % (programs, slack, " | ".join(cells)), flush=True)
    lora_triton.PROGRAMS, lora_triton.ROW_SLACK = 128, 8
    if "kernels" in sys.argv:  # the kernels' own tiles and warps
        print("| BK | SPLIT_MAX | shrink warps | expand warps | expand cols | 1 row | 64 rows |")
        print("|---|---|---|---|---|---|---|")
        cols0 = lora_triton.EXPAND_COLS
        for bk, smax, sw, ew, ec in [(64, 16, 4, 4, 64), (128, 16, 4, 4, 64), (64, 32, 4, 4, 64), (64, 16, 2, 4, 64), (64, 16, 4, 2, 64),
                                     (64, 16, 4, 4, 128), (128, 32, 2, 2, 64), (128, 16, 2, 2, 128), (32, 32, 2, 2, 64)]:
            lora_triton.SHRINK_BK, lora_triton.SPLIT_MAX, lora_triton.SHRINK_WARPS, lora_triton.EXPAND_WARPS = bk, smax, sw, ew
            lora_triton.EXPAND_COLS = tuple(c for c in (128, 64, 32, 16) if c <= ec)
            cells = []
            for N in (1, 64):
                io, xy = inputs[N]
                with torch.no_grad():
                    per = [timed(lambda: [pl.add(y, x, li, P) for pl in [lora.SegmentPlan.of(s, io)] for li in range(LAYERS)])
                           for P, (x, y) in xy.items()]
                cells.append("%.1f (%s)" % (sum(per), "/".join("%.0f" % v for v in per)))
            print("| %d | %d | %d | %d | %d | %s |" % (bk, smax, sw, ew, ec, " | ".join(cells)), flush=True)
        lora_triton.SHRINK_BK, lora_triton.SPLIT_MAX, lora_triton.SHRINK_WARPS, lora_triton.EXPAND_WARPS = 128, 16, 2, 2
        lora_triton.EXPAND_COLS = cols0
    from torch.profiler import ProfilerActivity, profile
    for N in (1, 64) if "profile" in sys.argv else ():
        io, xy = inputs[N]
        with torch.no_grad():
            plan = lora.SegmentPlan.of(s, io)
            for P, (x, y) in xy.items():
                plan.add(y, x, 0, P)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for li in range(LAYERS):
                    for P, (x, y) in xy.items():
                        plan.add(y, x, li, P)
                torch.cuda.synchronize()
        print("%d rows, eager, GPU time per layer by kernel:" % N)
        for e in sorted(prof.key_averages(), key=lambda e: -getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)))[:6]:
            print("  %-40s %7.1f µs a layer, %d calls" % (e.key[:40], getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)) / LAYERS, e.count))


main()

"""Where a sparse layer's decode time goes, and which tiles its fused
kernels should take: moe_triton's pieces timed one by one in Qwen3-30B-A3B's
shape (bfloat16, CUDA graphs), then a sweep of the gate_up and down
kernels' tiles at decode sizes.

  python3 moe_sweep.py RUNTIME_DIR [SECONDS]

Each time is the median of 30 replays of one CUDA graph that runs the
piece over LAYERS distinct layers (so the experts' weights come from
memory, not L2, as in a model), divided by LAYERS. SECONDS bounds the
sweep (default 150).
"""
import itertools
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

from mlxsworker.torchrt import graphs, moe, moe_triton  # noqa: E402

budget = float(sys.argv[2]) if len(sys.argv) > 2 else 150.0
dev, dtype = torch.device("cuda"), torch.bfloat16
E, k, H, inter = 128, 8, 2048, 768
LAYERS = 4
g = torch.Generator(device=dev).manual_seed(0)
Ls = [{"router": torch.randn(E, H, generator=g, device=dev).to(dtype) * 0.5,
       "experts_gu": (torch.randn(E, 2 * inter, H, generator=g, device=dev) / H ** 0.5).to(dtype),
       "experts_down": (torch.randn(E, H, inter, generator=g, device=dev) / inter ** 0.5).to(dtype)} for _ in range(LAYERS)]


def timed(fn):
    def many():
        return [fn(i) for i in range(LAYERS)]
    gr, _ = graphs.record(many, torch.cuda.graph_pool_handle(), warmup=2)
    ts = []
    for _ in range(30):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        gr.replay()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1e3 / LAYERS)
    return sorted(ts)[len(ts) // 2]


a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
b = torch.empty_like(a)
for _ in range(3):
    b.copy_(a)
t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
t0.record()
for _ in range(10):
    b.copy_(a)
t1.record()
torch.cuda.synchronize()
bw = 2 * 10 * (1 << 30) / (t0.elapsed_time(t1) / 1e3)
del a, b
print("copy rate %.0f GB/s; times are µs a layer (median of 30 replays of %d layers in one graph)" % (bw / 1e9, LAYERS))


def act_mul(gu):
    x, u = gu.chunk(2, dim=-1)
    return F.silu(x) * u


class Cfg:
    top_k, experts, norm_topk, hidden = k, E, True, H

    class family:
        act = "silu"


ex = moe.Experts(Cfg, dev, dtype, Ls, act_mul, kernels=True)
assert ex.fused is moe_triton
print("| tokens | touched | bound | whole layer | router GEMM | route | align | gate_up | down | sum over k |")
print("|---|---|---|---|---|---|---|---|---|---|")
cases = {}
for n in (1, 8, 64):
    x = torch.randn(n, H, generator=g, device=dev).to(dtype)
    P = n * k
    BM = moe.tiles(P)[0]
    nb = moe.max_blocks(P, E, BM)
    logits = [F.linear(x, L["router"]) for L in Ls]
    routed = [moe_triton.route(lg, k, True) for lg in logits]
    al = [moe_triton.align(r[1].reshape(-1), E, BM, nb) for r in routed]
    wts = [r[0].to(dtype).reshape(-1) for r in routed]
    touched = sum(torch.unique(r[1]).numel() for r in routed) / LAYERS
    bound = touched * 3 * H * inter * 2 / bw * 1e6
    out = torch.empty(nb * BM, inter, device=dev, dtype=dtype)
    ys = torch.empty(P, H, device=dev, dtype=dtype)
    t = moe.tiles(P)

    # The step's tensors bound now (defaults), not when the sweep calls.
    def gate_up(i, BN=t[1], BK=t[2], warps=t[3], stages=t[4], x=x, al=al, P=P, BM=BM, nb=nb, out=out):
        rows, bexp = al[i]
        moe_triton._gate_up_kernel[(nb, triton.cdiv(inter, BN))](
            x, Ls[i]["experts_gu"], rows, bexp, out, P, E, H, inter, x.stride(0), Ls[i]["experts_gu"].stride(0),
            Ls[i]["experts_gu"].stride(1), out.stride(0), TOPK=k, BM=BM, BN=BN, BK=BK, PREC="tf32", num_warps=warps, num_stages=stages)
        return out

    def down(i, BN=t[1], BK=t[2], warps=t[3], stages=t[4], al=al, wts=wts, P=P, BM=BM, nb=nb, out=out, ys=ys):
        rows, bexp = al[i]
        moe_triton._down_kernel[(nb, triton.cdiv(H, BN))](
            out, Ls[i]["experts_down"], rows, bexp, wts[i], ys, P, E, inter, H, out.stride(0), Ls[i]["experts_down"].stride(0),
            Ls[i]["experts_down"].stride(1), ys.stride(0), BM=BM, BN=BN, BK=BK, PREC="tf32", num_warps=warps, num_stages=stages)
        return ys

    row = [timed(lambda i: ex.forward(x, Ls[i], act_mul)),
           timed(lambda i: F.linear(x, Ls[i]["router"])),
           timed(lambda i: moe_triton.route(logits[i], k, True)),
           timed(lambda i: moe_triton.align(routed[i][1].reshape(-1), E, BM, nb)),
           timed(gate_up), timed(down),
           timed(lambda i: ys.view(n, k, -1).sum(dim=1))]
    print("| %d | %.1f | %.1f | %s |" % (n, touched, bound, " | ".join("%.1f" % v for v in row)))
    cases[n] = (gate_up, down, touched)

# The tile sweep: each kernel alone, the current tiles first.
start = time.time()
cands = list(itertools.product((16, 32, 64, 128), (64, 128, 256), (2, 4, 8), (2, 3, 4, 5)))
for n, (gate_up, down, touched) in cases.items():
    for name, fn, frac in (("gate_up", gate_up, 2 / 3), ("down", down, 1 / 3)):
        bound = frac * touched * 3 * H * inter * 2 / bw * 1e6
        cur = moe.tiles(n * k)
        res = [((cur[1], cur[2], cur[3], cur[4]), timed(fn))]
        for BN, BK, warps, stages in cands:
            # Half the budget to one token (batch-1 decode), a quarter each to 8 and 64.
            share = {1: (0.3, 0.5), 8: (0.62, 0.75), 64: (0.87, 1.0)}[n][name == "down"]
            if time.time() - start > budget * share:
                break
            try:
                res.append(((BN, BK, warps, stages), timed(lambda i: fn(i, BN, BK, warps, stages))))
            except Exception as e:  # out of shared memory, say
                res.append(((BN, BK, warps, stages), float("inf")))
                print("  %s %s: %s" % (name, (BN, BK, warps, stages), str(e).splitlines()[0][:120]))
        best = sorted(res[1:], key=lambda r: r[1])[:5]
        print("%d tokens %s (bound %.1f µs): current %s %.1f µs; %d tried; best %s" % (
            n, name, bound, res[0][0], res[0][1], len(res) - 1,
            ", ".join("%s %.1f" % (c, v) for c, v in best)))

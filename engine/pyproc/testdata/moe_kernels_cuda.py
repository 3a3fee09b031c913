"""moe_triton's fused expert kernels on a GPU against moe.Experts' loop
over experts (and, for speed, its grouped GEMM): the shapes of
Qwen3-30B-A3B (128 experts of 768, 8 active, hidden 2048; the
renormalised and the raw top-k), Mixtral (8 experts of 14,336 over
4,096, 2 active) and a tiny model, in bfloat16, float16 and float32, for
1 to 1,500 tokens (both tile shapes, decode blocks and prompt blocks),
eagerly and replayed from a CUDA graph with the routing changed between
replays. Then Experts itself: it picks the fused kernels at load on
these weights and its decode path captures. First the decode routing
kernels (moe_triton.route, align) against the torch code they replace.

  python3 moe_kernels_cuda.py RUNTIME_DIR [bench]

With bench, also the time of one sparse layer a step (CUDA graphs,
median of 50 replays) for the fused kernels and the grouped GEMM at 1,
8, 64 and 256 tokens in Qwen3-30B-A3B's shape, against the time to read
the experts the step touches at the GPU's copy rate.

Prints "N passed, 0 failed" or raises. Run by TestMoEKernelsCUDA.
"""
import sys
from types import SimpleNamespace

sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from mlxsworker.torchrt import graphs, moe, moe_triton  # noqa: E402

dev = torch.device("cuda")
SHAPES = {  # experts, top k, hidden, expert width, renormalise
    "qwen3-30b-a3b": (128, 8, 2048, 768, True),
    "qwen3-30b-a3b raw top-k": (128, 8, 2048, 768, False),
    "mixtral (4 of 8 experts' layers)": (8, 2, 4096, 14336, True),
    "tiny": (4, 2, 64, 48, True),
}
TOL = {torch.bfloat16: 2e-2, torch.float16: 1e-2, torch.float32: 1e-4}


def act_mul(gu):
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


def layer(name, dtype, g):
    E, k, H, inter, renorm = SHAPES[name]
    cfg = SimpleNamespace(top_k=k, experts=E, norm_topk=renorm, hidden=H, family=SimpleNamespace(act="silu"))
    L = {"router": (torch.randn(E, H, generator=g) * 0.5).to(dev, dtype),
         "experts_gu": (torch.randn(E, 2 * inter, H, generator=g) / H ** 0.5).to(dev, dtype),
         "experts_down": (torch.randn(E, H, inter, generator=g) / inter ** 0.5).to(dev, dtype)}
    return cfg, L


def kernel_routing(ex, x, L, cfg):
    """The routing the fused path takes for rows x: the routing kernel's
    where it runs (bfloat16 logits tie, and torch's top k may order
    equal values otherwise), torch's where it does not."""
    if x.shape[0] * cfg.top_k > moe.DECODE_PAIRS:
        return ex.route(x, L)
    w, idx = moe_triton.route(F.linear(x, L["router"]), cfg.top_k, cfg.norm_topk)
    return w.to(x.dtype), idx


passed = 0
g = torch.Generator().manual_seed(0)

# The decode routing kernels against the torch code they replace: the
# same experts in the same order and weights within float32 rounding
# (route), the same rows and blocks exactly (align), for expert counts
# that are and are not powers of two, up to ALIGN_MAX_PAIRS pairs.
for E, k, renorm in ((128, 8, True), (128, 8, False), (8, 2, True), (60, 4, True), (256, 8, True), (63, 6, True), (127, 3, True)):
    cfg = SimpleNamespace(top_k=k, experts=E, norm_topk=renorm, hidden=64, family=SimpleNamespace(act="silu"))
    ex = moe.Experts(cfg, dev, torch.float32, [], act_mul)
    for n in (1, 2, 3, 7, 64, 100, moe_triton.ALIGN_MAX_PAIRS // k):
        # float32 logits: bfloat16 ones tie often enough that torch.topk's
        # unspecified order among equals would fail the comparison.
        L = {"router": torch.randn(E, 64, generator=g).to(dev)}
        h = torch.randn(n, 64, generator=g).to(dev)
        w_want, idx_want = ex.route(h, L)
        idx = idx_want
        if k & (k - 1) == 0:  # the routing kernel takes a power of two
            wf, idx = moe_triton.route(torch.nn.functional.linear(h, L["router"]), k, renorm)
            assert torch.equal(idx, idx_want), (E, k, n, idx, idx_want)
            assert torch.allclose(wf, w_want, atol=1e-6, rtol=1e-5), (E, k, n, (wf - w_want).abs().max().item())
            # A NaN row routes to experts that exist (its own rows, NaN,
            # carry the NaN into its output).
            h[0] = float("nan")
            _, ixn = moe_triton.route(torch.nn.functional.linear(h, L["router"]), k, renorm)
            assert bool(((ixn[0] >= 0) & (ixn[0] < E)).all()), (E, k, ixn[0])
        P = n * k
        for BM in (16, 64):
            rows, bexp = moe_triton.align(idx.reshape(-1), E, BM, moe.max_blocks(P, E, BM))
            rw, bw = moe.align(idx.reshape(-1), E, BM)
            assert torch.equal(rows, rw) and torch.equal(bexp, bw), (E, k, n, BM, rows, rw, bexp, bw)
            passed += 1
        passed += 1
for name in SHAPES:
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        if name.startswith("mixtral") and dtype != torch.bfloat16:
            continue  # 3.5 GB a dtype: bfloat16 covers its shapes
        cfg, L = layer(name, dtype, g)
        ex = moe.Experts(cfg, dev, dtype, [L], act_mul, kernels=True)
        assert ex.fused is moe_triton and ex.capturable, (name, dtype, "the fused kernels were not chosen")
        tol = TOL[dtype]
        for n in (1, 2, 3, 8, 64, 129, 300, 1500):
            x = (torch.randn(n, cfg.hidden, generator=g)).to(dev, dtype)
            routed = kernel_routing(ex, x, L, cfg)
            got = ex.forward(x, L, act_mul).float()
            want = ex.forward(x, L, act_mul, grouped=False, routed=routed).float()
            d = (got - want).abs().max().item()
            # A relative bound: outputs are sums of k experts' rows.
            assert torch.allclose(got, want, atol=tol, rtol=tol), (name, dtype, n, d)
            passed += 1
        # Graph replays, the routing changed between them.
        for n in (1, 64):
            x = torch.randn(n, cfg.hidden, generator=g).to(dev, dtype)
            gr, out = graphs.record(lambda: ex.forward(x, L, act_mul), torch.cuda.graph_pool_handle(), warmup=1)
            for _ in range(3):
                x.copy_(torch.randn(n, cfg.hidden, generator=g).to(dev, dtype))
                gr.replay()
                want = ex.forward(x, L, act_mul, grouped=False, routed=kernel_routing(ex, x, L, cfg))
                assert torch.allclose(out.float(), want.float(), atol=tol, rtol=tol), (name, dtype, "replay", n)
                passed += 1
        del L, ex
        torch.cuda.empty_cache()
print("%d passed, 0 failed" % passed)

if len(sys.argv) > 2 and sys.argv[2] == "bench":
    dtype = torch.bfloat16
    cfg, L = layer("qwen3-30b-a3b", dtype, g)
    ex = moe.Experts(cfg, dev, dtype, [L], act_mul, kernels=True)
    E, k, H, inter, _ = SHAPES["qwen3-30b-a3b"]
    # The copy rate, for the bound: a large device-to-device copy.
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
    expert_bytes = 3 * H * inter * 2
    print("one sparse layer, qwen3-30b-a3b shape, bfloat16, CUDA graphs; bound: the experts touched at %.0f GB/s" % (bw / 1e9))
    print("| tokens | experts touched | fused µs | grouped µs | bound µs | fused, share of the bound | grouped / fused |")
    print("|---|---|---|---|---|---|---|")

    def timed(fn):
        gr, _ = graphs.record(fn, torch.cuda.graph_pool_handle(), warmup=2)
        ts = []
        for _ in range(50):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            gr.replay()
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) * 1e3)
        return sorted(ts)[len(ts) // 2]

    for n in (1, 8, 64, 256):
        x = torch.randn(n, H, generator=g).to(dev, dtype)
        touched = torch.unique(ex.route(x, L)[1]).numel()
        tf = timed(lambda: ex.forward(x, L, act_mul))
        tg = timed(lambda: ex.forward(x, L, act_mul, grouped=True))
        bound = touched * expert_bytes / bw * 1e6
        print("| %d | %d | %.1f | %.1f | %.1f | %.2f | %.2fx |" % (n, touched, tf, tg, bound, bound / tf, tg / tf))

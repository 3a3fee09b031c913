"""moe.align, the fused expert kernels' block layout, on the CPU: for
random and adversarial routings (every pair on one expert, every expert
hit once, counts that are and are not multiples of the block), each pair
sits in exactly one padded row, each block holds pairs of its expert
alone, in pair order, blocks past those in use are padding, and the rows
fit moe.max_blocks. Then the blocks run as moe_triton's two kernels do
(each block's rows gathered, its expert's gate_up, silu * up, down,
times the routing weight, written at the pair's row, the k choices
summed), in plain torch, against moe.Experts' loop over experts:
equal in float32 within rounding. The kernels' arithmetic itself runs
on CUDA only (moe_kernels_cuda.py).

  python3 moe_align_test.py RUNTIME_DIR

Prints "N passed, 0 failed" or raises. Run by TestMoEAlign.
"""
import sys
import types

sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from mlxsworker.torchrt import moe  # noqa: E402
from standins import MoEKern  # noqa: E402  (beside this script)

passed = 0


def check_layout(flat, E, BM):
    global passed
    P = flat.numel()
    rows, bexp = moe.align(flat, E, BM)
    nb = moe.max_blocks(P, E, BM)
    assert rows.shape == (nb * BM,) and bexp.shape == (nb,), (rows.shape, bexp.shape, nb)
    assert rows.dtype == torch.int32 and bexp.dtype == torch.int32
    live = rows[rows < P]
    assert sorted(live.tolist()) == list(range(P)), "every pair in exactly one row"
    last = -1
    for b in range(nb):
        r = rows[b * BM:(b + 1) * BM]
        e = int(bexp[b])
        pairs = r[r < P]
        if e >= E:
            assert e == E and pairs.numel() == 0, (b, e, r)
            last = E
            continue
        assert last != E, "a block in use after the padding blocks"
        assert e >= last, "blocks in expert order"
        last = e
        assert pairs.numel() > 0, "a block in use holds a pair"
        assert bool((flat[pairs.long()] == e).all()), (b, e, flat[pairs.long()])
        assert pairs.tolist() == sorted(pairs.tolist()), "pair order within an expert"
        assert bool((r[:pairs.numel()] < P).all()), "padding only at a block's end"
    counts = torch.bincount(flat, minlength=E)
    used = int(((counts + BM - 1) // BM).sum())
    assert int((bexp < E).sum()) == used, (used, bexp)
    passed += 1


def emulate(h, L, w, idx, k, E, BM):
    """The fused kernels' blocks in plain torch (standins.MoEKern), summed
    over each token's k choices."""
    rows, bexp = moe.align(idx.reshape(-1), E, BM)
    ys = MoEKern.experts(h, L["experts_gu"], L["experts_down"], rows, bexp, w.reshape(-1), k, (BM,))
    return ys.view(h.shape[0], k, -1).sum(dim=1)


def act_mul(gu):
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


g = torch.Generator().manual_seed(0)
for E, BM in ((4, 16), (8, 16), (128, 16), (128, 64), (60, 16)):
    for P in (0, 1, 2, 8, 15, 16, 17, 64, 300, 1024, 1080):
        check_layout(torch.randint(0, E, (P,), generator=g), E, BM)
    check_layout(torch.full((100,), E - 1, dtype=torch.int64), E, BM)  # one expert takes every pair
    check_layout(torch.arange(E, dtype=torch.int64), E, BM)  # each expert one pair: the most padding
    check_layout(torch.arange(E, dtype=torch.int64).repeat_interleave(BM), E, BM)  # whole blocks, none padded
    check_layout(torch.arange(E, dtype=torch.int64).repeat_interleave(BM + 1), E, BM)

# The blocks' arithmetic against the loop, through Experts (CPU: the loop).
for name, E, k, H, inter, renorm in (("qwen3_moe", 16, 4, 64, 48, True), ("mixtral", 8, 2, 64, 96, True),
                                     ("qwen3_moe, norm_topk_prob false", 32, 8, 32, 16, False)):
    cfg = types.SimpleNamespace(top_k=k, experts=E, norm_topk=renorm, hidden=H, family=types.SimpleNamespace(act="silu"))
    ex = moe.Experts(cfg, torch.device("cpu"), torch.float32, [], act_mul)
    L = {"router": torch.randn(E, H, generator=g) * 0.5,
         "experts_gu": torch.randn(E, 2 * inter, H, generator=g) / H ** 0.5,
         "experts_down": torch.randn(E, H, inter, generator=g) / inter ** 0.5}
    for n in (1, 3, 37, 200):
        h = torch.randn(n, H, generator=g)
        w, idx = ex.route(h, L)
        for BM in (16, 64):
            got = emulate(h, L, w, idx, k, E, BM)
            want = ex.forward(h, L, act_mul)
            d = (got - want).abs().max().item()
            assert d < 1e-5, (name, n, BM, d)
            passed += 1

print("%d passed, 0 failed" % passed)

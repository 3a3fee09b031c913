"""lora.SegmentPlan (lora_triton.py's segmented kernels) on a GPU against
the delta computed row group by row group in float32 (reference):
random slots of llama-shaped projections (split q/k/v and gate/up,
fused, and a tiny model's narrow modules; ranks 8 to 128, the highest
packing the widest shrink tiles), rows of many slots and the
base interleaved, one row to 2,048, eagerly and replayed from a CUDA
graph (the rows' slots changed between replays), bfloat16 and float32;
rows of the base and of empty slots must come back untouched. The same
with each shrink on the slots' side stream (begin, then add: eagerly and
in a graph). At ranks 64 and 128 every variant a step launches builds
(warm). Then the load-time check (_check_kernels) keeps these kernels
and turns off one that adds nothing.

  python3 lora_kernels_cuda.py RUNTIME_DIR

Prints "N passed, 0 failed" or raises. Run by TestAdapterKernelsCUDA.
"""
import sys
from types import SimpleNamespace

sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402

from mlxsworker.torchrt import graphs, lora  # noqa: E402

SHAPES = {
    "8b": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336),
    "tiny": dict(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128),
    "phi3": dict(hidden=3072, heads=24, kv_heads=8, head_dim=128, intermediate=8192),
}


def slots_of(name, n, rank, dtype, fused_family=False, side=False):
    fam = SimpleNamespace(attn="fused" if fused_family else "split", mlp="fused" if fused_family else "split")
    cfg = SimpleNamespace(family=fam, **SHAPES[name])
    s = lora.Slots(cfg, [{"gate_up": None}], torch.device("cuda"), dtype, n, rank, kernels=True, side_stream=side)
    assert s.fused, "the kernels do not cover %s" % name
    assert (s.side is not None) == side
    s._allocate()
    return s


def fill(s, g, used):
    """Random A and B in the slots of used (0-based), the others zero."""
    with torch.no_grad():
        for P, A in s.A[0].items():
            for k in used:
                A[k].copy_(torch.randn(A[k].shape, generator=g) * 0.05)
                for B in s.B[0][P]:
                    B[k].copy_(torch.randn(B[k].shape, generator=g) * 0.05)


def reference(s, idx, x, y, P):
    """y plus each row's adapter's delta, in float32, one slot at a time."""
    A, out = s.A[0][P].float(), y.float().clone()
    at_slot = torch.tensor(idx, device=y.device)
    for v in sorted(set(idx) - {0}):
        rows, at = (at_slot == v).nonzero().flatten(), 0
        for j, B in enumerate(s.B[0][P]):
            o = B.shape[2]
            out[rows, at : at + o] += (x[rows].float() @ A[v - 1, j].T) @ B[v - 1].float()
            at += o
    return out


def compare(s, idx, g, tol, graph=False, side=False):
    dev = torch.device("cuda")
    N = len(idx)
    io = torch.tensor(idx, device=dev)
    xs = {P: (torch.randn(N, w, generator=g) * 0.5).to(dev, s.dtype) for P, (w, _) in s.proj[0].items()}
    ys = {P: torch.randn(N, sum(o for _, o in mods), generator=g).to(dev, s.dtype) for P, (_, mods) in s.proj[0].items()}

    def step():
        plan = lora.SegmentPlan.of(s, io)
        out = []
        for P in s.A[0]:
            # With side, the shrink on the side stream begins before the
            # base's output (here its copy) is made, as in decoder.proj.
            started = plan.begin(xs[P], 0, P) if side else None
            out.append(plan.add(ys[P].clone(), xs[P], 0, P, started))
        return out

    with torch.no_grad():
        want = [reference(s, idx, xs[P], ys[P], P) for P in s.A[0]]
        got = step()
        if graph:
            g_, out = graphs.record(step, torch.cuda.graph_pool_handle())
            g_.replay()
            got = out
    untouched = torch.tensor([v == 0 or not s.names_used[v - 1] for v in idx], device=dev)
    for P, a, b in zip(s.A[0], got, want):
        err = (a.float() - b).abs().max().item()
        assert err <= tol * (1 + b.abs().max().item()), "%s N=%d graph=%s: max diff %g" % (P, N, graph, err)
        assert torch.equal(a[untouched], ys[P][untouched]), "%s N=%d: rows of the base or empty slots changed" % (P, N)
    return 1


def main():
    g = torch.Generator().manual_seed(0)
    passed = 0
    for name, n, rank, dtype, fused_family in [("8b", 8, 16, torch.bfloat16, False), ("8b", 32, 16, torch.bfloat16, False),
                                               ("tiny", 5, 12, torch.float32, False), ("phi3", 4, 64, torch.bfloat16, True),
                                               ("tiny", 3, 8, torch.bfloat16, False),
                                               ("8b", 3, 64, torch.bfloat16, False), ("8b", 2, 128, torch.bfloat16, False)]:
        s = slots_of(name, n, rank, dtype, fused_family)
        if rank >= 64:  # every variant a step up to 4,096 rows launches builds at these ranks' tiles
            s.warm()
            assert s.fused, "a kernel variant failed to build at rank %d (see the warning)" % rank
        used = [k for k in range(n) if k % 4 != 3]  # some slots stay empty
        s.names_used = [k in used for k in range(n)]
        fill(s, g, used)
        tol = 2e-4 if dtype == torch.float32 else 3e-2
        for N in (1, 3, 64, 300, 2048):
            idx = [int(v) for v in torch.randint(0, n + 1, (N,), generator=g)]
            passed += compare(s, idx, g, tol)
            passed += compare(s, sorted(idx), g, tol)  # contiguous segments, as a prompt chunk's rows
        passed += compare(s, [0] * 7, g, tol)  # the base alone
        passed += compare(s, [1] * 64, g, tol, graph=True)
        passed += compare(s, [(i * 7) % (n + 1) for i in range(48)], g, tol, graph=True)
    # The graph replayed with other slots in its input: the segments are
    # recomputed on the device at every replay.
    s = slots_of("8b", 8, 16, torch.bfloat16)
    s.names_used = [True] * 8
    fill(s, g, range(8))
    dev = torch.device("cuda")
    io = torch.zeros(64, dtype=torch.long, device=dev)
    x = (torch.randn(64, 4096, generator=g) * 0.5).to(dev, torch.bfloat16)
    y0 = torch.randn(64, 6144, generator=g).to(dev, torch.bfloat16)
    gr, out = graphs.record(lambda: lora.SegmentPlan.of(s, io).add(y0.clone(), x, 0, "qkv"), torch.cuda.graph_pool_handle())
    for trial in range(3):
        idx = [int(v) for v in torch.randint(0, 9, (64,), generator=g)]
        io.copy_(torch.tensor(idx))
        gr.replay()
        want = reference(s, idx, x, y0, "qkv")
        err = (out.float() - want).abs().max().item()
        assert err <= 3e-2 * (1 + want.abs().max().item()), "replay %d: max diff %g" % (trial, err)
        passed += 1
    # The shrink on the side stream (settings.lora_side_stream), eagerly
    # and captured (the fork and join as two branches of the graph).
    s = slots_of("8b", 8, 16, torch.bfloat16, side=True)
    used = [k for k in range(8) if k % 4 != 3]
    s.names_used = [k in used for k in range(8)]
    fill(s, g, used)
    for N in (1, 64, 300):
        idx = [int(v) for v in torch.randint(0, 9, (N,), generator=g)]
        passed += compare(s, idx, g, 3e-2, side=True)
        passed += compare(s, idx, g, 3e-2, graph=True, side=True)
    # The load-time check keeps kernels that agree, turns off a kernel that
    # adds nothing, and clears the slot it borrowed.
    s = slots_of("8b", 4, 16, torch.bfloat16)
    fill(s, g, [1])
    s._check_kernels(2)
    assert s.fused and s.checked, "the load-time check turned correct kernels off"
    assert all(float(t[3].abs().sum()) == 0 for pr in s.A + s.Bcat for t in pr.values()), "the check's slot kept weights"
    s = slots_of("8b", 4, 16, torch.bfloat16)
    fill(s, g, [1])
    s.kern = SimpleNamespace(ROW_TILES=s.kern.ROW_TILES, delta=lambda y, *args: y)
    s._check_kernels(2)
    assert not s.fused, "a kernel that adds nothing passed the load-time check"
    passed += 2
    print("%d passed, 0 failed" % passed)


main()

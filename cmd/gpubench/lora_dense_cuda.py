"""lora.DensePlan on a GPU: the delta of every projection of a llama-shaped
stack of layers (random slots) against lora.Plan, eagerly and replayed
from a CUDA graph, and the time a captured step of deltas alone takes
(the adapters' cost on a decode step, an upper bound: each projection's
output is copied first; compare with the base's step time). Then, where
the segmented kernels run (lora_triton.py), a table of each projection's
delta per layer, DensePlan against SegmentPlan, with USED of the slots
holding adapters and the rows spread over them, beside the base
projection's GEMM: where each plan spends its time, batch by batch.

  python3 lora_dense_cuda.py RUNTIME_DIR [8b|1b] [SLOTS] [RANK] [DTYPE] [USED]

Prints one line per batch size, raises on a disagreement. Needs CUDA.
"""
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402

from mlxsworker.torchrt import graphs, lora  # noqa: E402

SHAPES = {"8b": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, layers=32),
          "1b": dict(hidden=2048, heads=32, kv_heads=8, head_dim=64, intermediate=8192, layers=16)}


def timed(fn, reps=50):
    """Milliseconds a CUDA graph of fn takes a replay (median of 5)."""
    gr, _ = graphs.record(fn, torch.cuda.graph_pool_handle())
    runs = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            gr.replay()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t0) * 1000 / reps)
    return sorted(runs)[2]


def slots_of(shape, dtype, n, rank, kernels=False):
    """n CUDA slots of rank rank over a llama-shaped stack (shape, with
    its "layers"); kernels: the segmented kernels where they run."""
    cfg = SimpleNamespace(family=SimpleNamespace(attn="split", mlp="split"), **{k: v for k, v in shape.items() if k != "layers"})
    return lora.Slots(cfg, [{"gate_up": None}] * shape["layers"], torch.device("cuda"), dtype, n, rank, kernels=kernels)


def segmented_slots(shape, dtype, n, rank, used):
    """Slots of a llama-shaped stack (shape, with its "layers") served by
    the segmented kernels, the first used of n slots of rank rank holding
    random adapters; None where the kernels do not run."""
    s = slots_of(shape, dtype, n, rank, kernels=True)
    if not s.fused:
        return None
    s._allocate()
    with torch.no_grad():
        for li in range(shape["layers"]):
            for P, A in s.A[li].items():
                A[:used].normal_(0, 0.05)
                for B in s.B[li][P]:
                    B[:used].normal_(0, 0.05)
    return s


def per_projection(shape, n, rank, dtype, used):
    """Each projection's delta per layer (µs), the dense plan against the
    segmented kernels, beside the base GEMM of that projection."""
    dev = torch.device("cuda")
    L = shape["layers"]
    s = segmented_slots(shape, dtype, n, rank, used)
    if s is None:
        print("segmented kernels unavailable: no per-projection table")
        return
    base = {P: [torch.randn(sum(o for _, o in mods), w, device=dev, dtype=dtype) * 0.02 for _ in range(L)]
            for P, (w, mods) in s.proj[0].items()}
    print("| rows | projection | base GEMM µs | dense delta µs | segmented delta µs |")
    print("|---|---|---|---|---|")
    for N in (1, 16, 32, 64, 128, 512):
        io = torch.tensor([1 + i % used for i in range(N)], device=dev)
        for P, (w, mods) in s.proj[0].items():
            x = torch.randn(N, w, device=dev, dtype=dtype)
            y = torch.zeros(N, sum(o for _, o in mods), device=dev, dtype=dtype)
            with torch.no_grad():
                gemm = timed(lambda: [torch.nn.functional.linear(x, base[P][li], out=y) for li in range(L)])
                # One plan (its mask, or its sort) for the layers, as a step has.
                dense = timed(lambda: [pl.add(y, x, li, P) for pl in [lora.DensePlan(s, io)] for li in range(L)])
                seg = timed(lambda: [pl.add(y, x, li, P) for pl in [lora.SegmentPlan.of(s, io)] for li in range(L)])
            print("| %d | %s | %.1f | %.1f | %.1f |" % (N, P, gemm * 1000 / L, dense * 1000 / L, seg * 1000 / L), flush=True)


def main():
    shape = SHAPES[sys.argv[2] if len(sys.argv) > 2 else "8b"]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    rank = int(sys.argv[4]) if len(sys.argv) > 4 else 16
    dtype = getattr(torch, sys.argv[5] if len(sys.argv) > 5 else "bfloat16")
    dev = torch.device("cuda")
    s = slots_of(shape, dtype, n, rank)
    s._allocate()
    g = torch.Generator(device="cpu").manual_seed(0)
    with torch.no_grad():
        for li in range(len(s.A)):
            for P, A in s.A[li].items():
                A.copy_(torch.randn(A.shape, generator=g) * 0.05)
                for B in s.B[li][P]:
                    B.copy_(torch.randn(B.shape, generator=g) * 0.05)
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    for N in (1, 16, 64):
        idx = [i % (n + 1) for i in range(N)]
        io = torch.tensor(idx, device=dev)
        xs = {P: torch.randn(N, w, generator=g).to(dev, dtype) for P, (w, _) in s.proj[0].items()}
        ys = {P: torch.randn(N, sum(o for _, o in mods), generator=g).to(dev, dtype) for P, (_, mods) in s.proj[0].items()}

        def step():
            plan, out = s.device_plan(io), []
            for li in range(len(s.A)):
                for P in s.A[li]:
                    out.append(plan.add(ys[P].clone(), xs[P], li, P))
            return out

        with torch.no_grad():
            plan = lora.Plan(s, [(v, torch.tensor([i for i, w in enumerate(idx) if w == v], device=dev))
                                 for v in range(1, n + 1) if v in idx])
            want = [plan.add(ys[P].clone(), xs[P], li, P) for li in range(len(s.A)) for P in s.A[li]]
            eager = step()
            gr, out = graphs.record(step, torch.cuda.graph_pool_handle())
            gr.replay()
            torch.cuda.synchronize()
            for a, b, c in zip(eager, out, want):
                if not (torch.allclose(a.float(), c.float(), atol=tol, rtol=tol) and torch.allclose(b.float(), c.float(), atol=tol, rtol=tol)):
                    raise AssertionError("batch %d: dense %g, replayed %g from the per-adapter delta"
                                         % (N, (a.float() - c.float()).abs().max(), (b.float() - c.float()).abs().max()))
            t0 = time.perf_counter()
            for _ in range(100):
                gr.replay()
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 10
        print("batch %d: %d slots of rank %d over %d layers agree; one step's deltas replay in %.3f ms"
              % (N, n, rank, len(s.A), ms), flush=True)
    per_projection(shape, n, rank, dtype, int(sys.argv[6]) if len(sys.argv) > 6 else n)


if __name__ == "__main__":
    main()

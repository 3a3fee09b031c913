"""lora.DensePlan on a GPU: the delta of every projection of a llama-shaped
stack of layers (random slots) against lora.Plan, eagerly and replayed
from a CUDA graph, and the time a captured step of deltas alone takes
(the adapters' cost on a decode step, an upper bound: each projection's
output is copied first; compare with the base's step time).

  python3 lora_dense_cuda.py RUNTIME_DIR [8b|1b] [SLOTS] [RANK] [DTYPE]

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


def main():
    shape = SHAPES[sys.argv[2] if len(sys.argv) > 2 else "8b"]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    rank = int(sys.argv[4]) if len(sys.argv) > 4 else 16
    dtype = getattr(torch, sys.argv[5] if len(sys.argv) > 5 else "bfloat16")
    dev = torch.device("cuda")
    cfg = SimpleNamespace(family=SimpleNamespace(attn="split", mlp="split"), **{k: v for k, v in shape.items() if k != "layers"})
    s = lora.Slots(cfg, [{"gate_up": None}] * shape["layers"], dev, dtype, n, rank)
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
              % (N, n, rank, len(s.A), ms))


main()

"""What rowloop_sweep.py and int4_probe.py share: the projection shapes
of llama1b and llama8b, and the timing of one product as decode runs it
(CUDA graphs of reps launches, weights rotated past L2)."""
import torch

SHAPES = {"1b": [("qkv", 3072, 2048), ("o", 2048, 2048), ("gate_up", 16384, 2048), ("down", 2048, 8192)],
          "8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]}


def bench(fn, n_w, reps=20, iters=30):
    """Microseconds a call of fn(i), i over n_w rotating weights: reps
    calls captured in a CUDA graph, replayed iters times, best of 5."""
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

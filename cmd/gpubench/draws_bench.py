"""A step's temperature draws: the rows one at a time (the torch
backend's code before sampling.draws: each row filtered alone, then
torch.multinomial with a generator seeded for the draw) against
sampling.draws (every row at once), at several batch sizes over a
128,256-token vocabulary, with a server's default parameters (temperature
1) and with top-p 0.9. Prints milliseconds a step (median of REPS, the
device synchronised) and the operators a step runs (the torch profiler's
count: on CUDA each is a kernel launch from the host).

  python3 draws_bench.py RUNTIME_DIR [DEVICE [REPS]]
"""
import statistics
import sys
import time
import types

sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402
from torch.profiler import profile  # noqa: E402

from mlxsworker.torchrt import sampling  # noqa: E402

dev = torch.device(sys.argv[2] if len(sys.argv) > 2 else ("cuda" if torch.cuda.is_available() else "cpu"))
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
V = 128256


def one_row(row, params, gen):
    row = row / float(params["t"])
    k = int(params.get("k") or 0)
    if 0 < k < row.shape[-1]:
        row = row.masked_fill(row < torch.topk(row, k).values[-1], float("-inf"))
    probs = torch.softmax(row, dim=-1)
    p = float(params.get("p") or 0)
    if 0 < p < 1:
        sp, si = torch.sort(probs, descending=True)
        probs = torch.zeros_like(probs).scatter(0, si, sp.masked_fill(torch.cumsum(sp, dim=-1) - sp >= p, 0))
    gen.manual_seed(12345)
    return torch.multinomial(probs, 1, generator=gen)[0]


def per_row(logits, params, gens):
    out = torch.argmax(logits, dim=-1)
    for i in range(logits.shape[0]):
        out[i] = one_row(logits[i], params, gens[i])
    return out


def batched(logits, params, seqs):
    out = torch.argmax(logits, dim=-1)
    rows = list(range(logits.shape[0]))
    out[sampling.to_device(rows, dev)] = sampling.draws(logits, rows, [(params, s) for s in seqs])
    return out


def timed(fn):
    ts = []
    for _ in range(reps + 1):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn().tolist()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts[1:]) * 1e3


def count_ops(fn):
    with profile() as prof:
        fn().tolist()
    # Top-level aten operators only: the ones Python called.
    return len([e for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None])


print("device %s, vocabulary %d; ms a step (median of %d) and top-level operators a step" % (dev, V, reps))
print("| rows | parameters | one row at a time | at once | ops, one at a time | ops, at once |")
print("|---|---|---|---|---|---|")
g = torch.Generator().manual_seed(0)
for n in (1, 64, 220):
    logits = (torch.randn(n, V, generator=g) * 3).to(dev)
    for name, params in (("t 1", {"t": 1.0}), ("t 0.7, top-p 0.9", {"t": 0.7, "p": 0.9})):
        gens = [torch.Generator(device=dev) for _ in range(n)]
        seqs = [types.SimpleNamespace(gen=None) for _ in range(n)]
        a = timed(lambda: per_row(logits, params, gens))
        b = timed(lambda: batched(logits, params, seqs))
        print("| %d | %s | %.2f | %.2f | %d | %d |" % (n, name, a, b, count_ops(lambda: per_row(logits, params, gens)),
                                                   count_ops(lambda: batched(logits, params, seqs))))

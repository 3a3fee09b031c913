"""The worker's host time a decode step, on the CPU: the CUDA path's
Python (the protocol's Worker, TorchModel.step, the speculated next step
behind it, lookahead's plan and chain, sampling's bookkeeping) for a
batch of B decoding sequences, with the device work taken out: decode
graphs captured once and then replayed as no-ops, the Triton kernels
stood in by plain torch (standins.py) on a tiny model. Each step is sent
as a pipelining supervisor sends it (a JSON line: rows feeding the token
just sampled as null, "after" naming the step before) and its reply
encoded as the worker writes it. What is left of a step is the host's
own work, which the GPU waits behind when it exceeds the device's step.

  python3 host_step_bench.py RUNTIME_DIR MODEL_DIR [B [STEPS [PARAMS]]]

PARAMS: greedy (default) or sampled (temperature, top-p, top-k, a seed
and logprobs). Prints the median and mean host milliseconds a step over
STEPS steps (default 300) of B rows (default 220, the running batch of
the 1B serving table at 256 clients), and the microseconds a row.
Run by BenchmarkWorkerHostStep.
"""
import json
import statistics
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])  # the runtime; standins.py is beside this script

import torch  # noqa: E402

from mlxsworker.protocol import Worker  # noqa: E402
from mlxsworker.settings import Settings  # noqa: E402
from mlxsworker.torchrt import graphs  # noqa: E402
from mlxsworker.torchrt.model import TorchModel  # noqa: E402
from standins import Kern, record  # noqa: E402

path = sys.argv[2]
B = int(sys.argv[3]) if len(sys.argv) > 3 else 220
STEPS = int(sys.argv[4]) if len(sys.argv) > 4 else 300
PARAMS = {"greedy": {}, "sampled": {"t": 0.8, "p": 0.95, "k": 50, "s": 1, "l": True}}[sys.argv[5] if len(sys.argv) > 5 else "greedy"]


class Idle:
    """A captured graph whose replays do nothing: its output buffer keeps
    what the capture wrote (the device's work is not what is measured)."""

    def replay(self):
        pass


def record_once(step, pool, warmup=2):
    _, out = record(step, pool, warmup)
    return Idle(), out


def prompt(i):
    return [(i * 131 + j * 37 + 11) % 300 + 5 for j in range(40 + i % 30)]


def main():
    torch.set_num_threads(1)
    graphs.record, graphs.new_pool = record_once, lambda: object()
    m = TorchModel(path, {"device": "cpu", "max_batch": B + 8, "kv_capacity": (B + 8) * 1024}, Settings(overlap=True))
    m.model.kern = Kern(m.model)
    m.graphs = graphs.DecodeGraphs(m.model, m.kv, m.max_batch, m.cfg.context)
    w = Worker(None, None, None, False)
    w.models["m"] = m
    rid = 0

    def step(batch, after):
        nonlocal rid
        rid += 1
        req = {"id": rid, "op": "step", "model": "m", "batch": batch}
        if after:
            req["after"] = rid - 1
        line = json.dumps(req, separators=(",", ":"))
        r = w.handle(json.loads(line))
        json.dumps(r, separators=(",", ":"))
        return r["tokens"]

    ids = list(range(1, B + 1))
    with torch.no_grad():
        for i in ids:
            m.open(i, prompt(i), "")
        for k in range(0, B, 32):
            step([[i, prompt(i), True, dict(PARAMS)] for i in ids[k:k + 32]], False)
        batch = [[i, None, True, dict(PARAMS)] for i in ids]
        times = []
        for j in range(STEPS + 10):
            t0 = time.perf_counter()
            step(batch, j > 0)
            times.append(time.perf_counter() - t0)
    times = times[10:]
    med, mean = statistics.median(times) * 1e3, statistics.fmean(times) * 1e3
    sp = m.stats()["speculated"]
    assert sp["chained"] >= STEPS, sp  # every step ran on the device chain, the next one speculated behind it
    print("host ms a step: median %.3f mean %.3f (%d rows, %d steps, %s; %.2f us a row)"
          % (med, mean, B, STEPS, "sampled" if PARAMS else "greedy", med * 1e3 / B))


main()

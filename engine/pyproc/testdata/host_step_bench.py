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

  python3 host_step_bench.py RUNTIME_DIR MODEL_DIR [B [STEPS [PARAMS [MIX [KV]]]]]

PARAMS: greedy (default) or sampled (temperature, top-p, top-k, a seed
and logprobs). MIX: prompt (B is then a prompt's tokens: each step opens
one sequence, feeds its prompt whole on the whole-step prompt graphs and
frees it, as a lone prompt's first step runs; the host work before a
prompt step's launch is what its first token waits for), decode (default: every row a decode, each step the
device chain with the next step speculated behind it) or mixed (each
step the oldest sequence leaves and a new one joins with a 64-token
prompt in the step: the speculated decodes beside a prompt chunk, on the
whole-step prompt graphs, as most steps at 256 clients run). Prints the
median and mean host milliseconds a step over STEPS steps (default 300)
of B rows (default 220, the running batch of the 1B serving table at 256
clients), the steps that had the next one speculated behind them, and
the microseconds a row. KV: the pool's tokens per row (default 1,024; a
few hundred make mixed steps fill the prefix cache within the run, as a
server's pool fills, and then blocks taken ahead come from the cache's
idle ones). The sampled steps' torch ops
(softmax, sort, top-k over the vocabulary) run on the CPU here, where on
a GPU they are launches: part of their figure is not host time there.
Run by BenchmarkWorkerHostStep.
"""
import json
import statistics
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])  # the runtime; standins.py is beside this script

import torch  # noqa: E402

from mlxsworker.protocol import Worker, quiet_gc  # noqa: E402
from mlxsworker.settings import Settings  # noqa: E402
from mlxsworker.torchrt import decoder, graphs, prefill  # noqa: E402
from mlxsworker.torchrt.model import TorchModel  # noqa: E402
from standins import Kern, flash_varlen, record  # noqa: E402

path = sys.argv[2]
B = int(sys.argv[3]) if len(sys.argv) > 3 else 220
STEPS = int(sys.argv[4]) if len(sys.argv) > 4 else 300
PARAMS = {"greedy": {}, "sampled": {"t": 0.8, "p": 0.95, "k": 50, "s": 1, "l": True}}[sys.argv[5] if len(sys.argv) > 5 else "greedy"]
MIX = sys.argv[6] if len(sys.argv) > 6 else "decode"
MIXED = {"decode": False, "mixed": True, "prompt": True}[MIX]
PROMPT = 64
KV = int(sys.argv[7]) if len(sys.argv) > 7 else 1024


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


def worker(opts, prompt_limit):
    """The model (opts over the CPU device) as the CUDA path runs it, the
    device's work out (decode graphs replayed as no-ops, kernels stood
    in), and a protocol Worker serving it as "m". prompt_limit: prompt
    chunks of up to that many tokens on the whole-step graphs, as on
    CUDA (0: none)."""
    torch.set_num_threads(1)
    graphs.record, graphs.new_pool = record_once, lambda: object()
    decoder._flash_varlen = flash_varlen
    m = TorchModel(path, dict(opts, device="cpu"), Settings(overlap=True))
    m.model.kern = Kern(m.model)
    m.graphs = graphs.DecodeGraphs(m.model, m.kv, m.max_batch, m.cfg.context)
    if prompt_limit:
        m.model.varlen = m.model.sdpa = True
        m.prefill = prefill.PrefillGraphs(m.model, m.kv, prompt_limit, paged=True)
    w = Worker(None, None, None, False)
    w.models["m"] = m
    quiet_gc()  # as Worker.load does
    return m, w


def prompt_steps():
    """MIX prompt: host ms of each step of one B-token prompt (open, the
    whole prompt in one step on the whole-step graphs, free)."""
    m, w = worker({"max_batch": 16, "context_length": B + 256, "kv_capacity": 16 * (B + 256)}, max(B, 64))
    times = []
    with torch.no_grad():
        for j in range(STEPS + 10):
            p = [(j * 7919 + k * 104729) % 300 + 5 for k in range(B)]  # unique: nothing to reuse
            t0 = time.perf_counter()
            w.handle({"id": 3 * j + 1, "op": "open", "model": "m", "seq": 1, "prompt": p})
            line = json.dumps({"id": 3 * j + 2, "op": "step", "model": "m", "batch": [[1, p, True, dict(PARAMS)]]},
                              separators=(",", ":"))
            r = w.handle(json.loads(line))
            assert "tokens" in r, r
            json.dumps(r, separators=(",", ":"))
            w.handle({"id": 3 * j + 3, "op": "free", "model": "m", "seq": 1, "key": ""})
            times.append(time.perf_counter() - t0)
    times = times[10:]
    med, mean = statistics.median(times) * 1e3, statistics.fmean(times) * 1e3
    print("host ms a step: median %.3f mean %.3f (one %d-token prompt, %d steps, %s; %.3f us a token)"
          % (med, mean, B, STEPS, "sampled" if PARAMS else "greedy", med * 1e3 / B))


def main():
    m, w = worker({"max_batch": B + 8, "kv_capacity": (B + 8) * KV}, 512 if MIXED else 0)
    rid, last = 0, None

    def step(batch, after):
        nonlocal rid, last
        rid += 1
        req = {"id": rid, "op": "step", "model": "m", "batch": batch}
        if after:
            req["after"] = last
        last = rid
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
        times = []
        nid = B
        for j in range(STEPS + 10):
            if j == 10:
                before = dict(m.speculated)
            t0 = time.perf_counter()
            if MIXED:  # the oldest leaves, a new prompt joins (unique: nothing to reuse)
                rid += 1
                w.handle({"id": rid, "op": "free", "model": "m", "seq": ids.pop(0), "key": ""})
                nid += 1
                p = [(nid * 7919 + k * 104729) % 300 + 5 for k in range(PROMPT)]
                rid += 1
                w.handle({"id": rid, "op": "open", "model": "m", "seq": nid, "prompt": p})
                batch = [[i, None, True, dict(PARAMS)] for i in ids] + [[nid, p, True, dict(PARAMS)]]
                ids.append(nid)
            else:
                batch = [[i, None, True, dict(PARAMS)] for i in ids]
            step(batch, j > 0)
            times.append(time.perf_counter() - t0)
    times = times[10:]
    med, mean = statistics.median(times) * 1e3, statistics.fmean(times) * 1e3
    # Timed steps that used the one speculated behind the step before:
    # beside a prompt chunk (mixed), on the device chain (decode).
    kind = "beside" if MIXED else "chained"
    used = m.speculated[kind] - before[kind]
    assert used > 0, m.speculated
    print("host ms a step: median %.3f mean %.3f (%d rows, %d steps, %s%s, %d used a speculated step; %.2f us a row)"
          % (med, mean, B, STEPS, "sampled" if PARAMS else "greedy", ", mixed" if MIXED else "", used, med * 1e3 / B))


if MIX == "prompt":
    prompt_steps()
else:
    main()

"""Where a serving step's time goes in the worker: drives a runtime's
TorchModel directly (no Go, no protocol) as a loaded server steps it:
BATCH sequences decoding at about CONTEXT tokens each while every step
brings one new prompt of PROMPT tokens (the oldest sequence leaves), so
each step mixes a prompt with the decodes. Prints, with the overlap
and prompt-step graph settings off, the overlap on, and both on (twice,
alternating; MIXED_CONFIGS=paged: the served configuration with the
prompt steps' graphs piecewise and whole, alternating), the wall time per step, the GPU's busy time per step
from the torch profiler (kernels on the one stream: their sum is the
busy time) and the top device and host ops; with HOST_PROFILE=1, also
cProfile's table of the host's time (blocking waits included); with
MIXED_CONFIGS=on, only the served configuration, once.

  mixed_prof.py RUNTIME_DIR CHECKPOINT [BATCH [PROMPT [CONTEXT [STEPS]]]]

Defaults: 220 sequences, 1,260-token prompts, 1,300-token contexts, 24
steps: the running batch and prompts of the 1B serving table at 256
clients.
"""
import cProfile
import os
import pstats
import sys
import time

rt, path = sys.argv[1], sys.argv[2]
HOST = os.environ.get("HOST_PROFILE") == "1"  # also cProfile the host for 8 steps
batch, plen, ctx, steps = [int(a) for a in sys.argv[3:7]] + [220, 1260, 1300, 24][len(sys.argv) - 3:]
sys.path.insert(0, rt)

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from mlxsworker.settings import Settings  # noqa: E402
from mlxsworker.torchrt.model import TorchModel  # noqa: E402


def prompt(n, seed):
    return [(seed * 7919 + j * 104729) % 120000 for j in range(n)]


def run(overlap, graphs, paged=True):
    m = TorchModel(path, {"max_batch": batch + 8, "context_length": 8192, "device": "cuda", "dtype": "bfloat16",
                          "kv_capacity": (batch + 8) * 4096},
                   Settings(overlap=overlap, prefill_graphs=graphs, prompt_attention=paged))
    seqs = {}  # id -> the token to feed next
    nid = 0
    # Start: batch sequences whose prompts reach about ctx tokens, staggered
    # lengths so they do not all cross blocks together.
    for i in range(batch):
        nid += 1
        p = prompt(ctx - 128 + (i * 37) % 128, nid)
        m.open(nid, p, "")
        seqs[nid] = p
    for k in range(0, batch, 8):
        ids = list(seqs)[k:k + 8]
        toks = m.step([[i, seqs[i], True, {}] for i in ids]).tokens
        for i, t in zip(ids, toks):
            seqs[i] = [t]

    def step():
        nonlocal nid
        old = next(iter(seqs))
        m.free(old, "")
        del seqs[old]
        nid += 1
        p = prompt(plen, nid)
        m.open(nid, p, "")
        seqs[nid] = p
        ids = list(seqs)
        toks = m.step([[i, seqs[i], True, {}] for i in ids]).tokens
        for i, t in zip(ids, toks):
            seqs[i] = [t]

    for _ in range(4):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / steps
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(8):
            step()
        torch.cuda.synchronize()
    ka = prof.key_averages()
    busy = sum(getattr(e, "self_device_time_total", 0) for e in ka if str(getattr(e, "device_type", "")).endswith("CUDA")) / 8e3
    print("overlap %s, prefill graphs %s, whole-step (paged attention) %s: batch %d + one %d-token prompt per step: %.2f ms per step (wall, %d steps); "
          "profiled: GPU busy %.2f ms per step; speculated %s"
          % (overlap, graphs, m.prefill is not None and m.prefill.paged, batch, plen, wall * 1e3, steps, busy, m.stats().get("speculated")))
    print(ka.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60))
    print(ka.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))
    if HOST:  # the host's own time per function, blocking waits included
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(8):
            step()
        torch.cuda.synchronize()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)
    m.close()
    torch.cuda.empty_cache()


# MIXED_CONFIGS=on runs only the served configuration (overlap and
# prompt-step graphs on), once.
configs = ((False, False), (True, False), (True, True), (False, False), (True, False), (True, True))
if os.environ.get("MIXED_CONFIGS") == "on":
    configs = ((True, True),)
if os.environ.get("MIXED_CONFIGS") == "paged":  # the served configuration, prompt steps piecewise and whole, alternating
    configs = ((True, True, False), (True, True, True), (True, True, False), (True, True, True))
for cf in configs:
    run(*cf)

"""Paged KV on a GPU: drives the runtime's TorchModel directly (no Go, no
protocol) on a checkpoint at its full context and prints

- the pool: blocks, tokens, bytes, the default max batch;
- decode tokens/s by batch size and block size (lookahead steps of AHEAD
  tokens, as the supervisor asks on CUDA), and the KV waste: the share of
  the sequences' blocks not holding tokens;
- the cost of steps that mix prompt chunks with decodes, the decodes on
  their CUDA graph and the chunks in a second pass (split) or all in one
  packed pass, against a decode-only step and the chunk alone.

  paged_bench.py RUNTIME_DIR CHECKPOINT [AHEAD]
"""
import gc
import os
import sys
import time

rt, path = sys.argv[1], sys.argv[2]
ahead = int(sys.argv[3]) if len(sys.argv) > 3 else 8
sys.path.insert(0, rt)

import torch  # noqa: E402

from mlxsworker.torchrt.model import TorchModel  # noqa: E402

PROMPT, STEPS = int(os.environ.get("PROMPT", "512")), 64
VOCAB = int(os.environ.get("VOCAB", "120000"))
DEV = os.environ.get("DEVICE", "cuda")  # cpu: a dry run of this script on the tiny model


def prompt(i, n, r=0):
    return [(i * 7919 + j * 104729 + r * 31) % VOCAB for j in range(n)]


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def load(bs, max_batch=0):
    opts = {"device": DEV, "dtype": "bfloat16" if DEV == "cuda" else "float32", "block_size": bs}
    if DEV != "cuda":
        opts["kv_capacity"] = 1 << 16
    if max_batch:
        opts["max_batch"] = max_batch
    t0 = time.perf_counter()
    m = TorchModel(path, opts)
    i = m.info()
    print("block %d: %d blocks = %d tokens, KV %.1f GB, context %d, max_batch %d, loaded in %.1f s"
          % (bs, i["kv_blocks"], i["kv_capacity"], i["kv_bytes"] / 1e9, i["context_length"], i["max_batch"],
             time.perf_counter() - t0), flush=True)
    return m


def decode(m, batch, r):
    ids = list(range(1000 * r + 1, 1000 * r + 1 + batch))
    last = []
    for g in range(0, batch, 64):  # prefill 64 prompts a step
        for i in ids[g : g + 64]:
            m.open(i, prompt(i, PROMPT, r), "")
        last += m.step([[i, prompt(i, PROMPT, r), True, {}] for i in ids[g : g + 64]]).tokens

    def step():
        nonlocal last
        res = m.step([[i, [t], True, {}, ahead, 0] for i, t in zip(ids, last)])
        if ahead > 1:
            last = [more[-1] if more else t for t, more in zip(res.tokens, res.more)]
            return ahead
        last = res.tokens
        return 1

    for _ in range(2):
        step()
    sync()
    t0 = time.perf_counter()
    n = 0
    while n < STEPS:
        n += step()
    sync()
    el = time.perf_counter() - t0
    waste = m.stats()["waste"]
    for i in ids:
        m.free(i, "")
    return batch * n / el, waste


def timed(fn, reps=5):
    ts = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2] * 1e3


def mixed(m, batch, chunks):
    """Per chunk size: ms of a decode step of batch sequences, of the
    chunk alone, and of both in one step, split and packed."""
    ids = list(range(1, batch + 1))
    for i in ids:
        m.open(i, prompt(i, PROMPT), "")
    last = m.step([[i, prompt(i, PROMPT), True, {}] for i in ids]).tokens
    state = {"last": last, "next": 100000}

    def dec():
        state["last"] = m.step([[i, [t], True, {}] for i, t in zip(ids, state["last"])]).tokens

    def chunk_step(n, with_decode):
        sid = state["next"]
        state["next"] += 1
        m.open(sid, prompt(sid, n), "")
        b = [[sid, prompt(sid, n), True, {}]]
        if with_decode:
            b = [[i, [t], True, {}] for i, t in zip(ids, state["last"])] + b
        out = m.step(b).tokens
        if with_decode:
            state["last"] = out[:-1]
        m.free(sid, "")

    for _ in range(3):
        dec()
    d = timed(dec)
    print("| chunk | decode %d alone ms | chunk alone ms | split ms | packed ms | split / (sum) |" % batch)
    print("|---|---|---|---|---|---|")
    for n in chunks:
        c = timed(lambda: chunk_step(n, False))
        m.split_steps = True
        s = timed(lambda: chunk_step(n, True))
        m.split_steps = False
        p = timed(lambda: chunk_step(n, True))
        m.split_steps = True
        print("| %d | %.2f | %.2f | %.2f | %.2f | %.2f |" % (n, d, c, s, p, s / (d + c)), flush=True)
    # A chunk continuing a prompt whose first part ran in an earlier step:
    # what a step carries when the token budget cuts prompts.
    print("| prefix + chunk | decode %d alone ms | chunk alone ms | with decodes ms |" % batch)
    print("|---|---|---|---|")
    for spec in os.environ.get("CONT", "1260:700,700:560,3000:2000").split(","):
        pre, n = (int(x) for x in spec.split(":"))

        def cont_step(with_decode):
            sid = state["next"]
            state["next"] += 1
            full = prompt(sid, pre + n)
            m.open(sid, full, "")
            m.step([[sid, full[:pre], False, {}]])
            sync()
            t0 = time.perf_counter()
            b = [[sid, full[pre:], True, {}]]
            if with_decode:
                b = [[i, [t], True, {}] for i, t in zip(ids, state["last"])] + b
            out = m.step(b).tokens
            sync()
            el = time.perf_counter() - t0
            if with_decode:
                state["last"] = out[:-1]
            m.free(sid, "")
            return el

        def med(fn):
            ts = sorted(fn() for _ in range(5))
            return ts[2] * 1e3

        print("| %d + %d | %.2f | %.2f | %.2f |" % (pre, n, d, med(lambda: cont_step(False)), med(lambda: cont_step(True))),
              flush=True)
        if os.environ.get("PROFILE") == "1" and DEV == "cuda":
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                cont_step(True)
            print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=18), flush=True)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), flush=True)
    for i in ids:
        m.free(i, "")


def main():
    print(torch.cuda.get_device_name() if DEV == "cuda" else DEV, torch.__version__, flush=True)
    for bs in (16, 32):
        m = load(bs)
        print("| block | batch | tok/s | KV waste |")
        print("|---|---|---|---|")
        for r, b in enumerate((1, 64, 128, 256)):
            if b > m.max_batch:
                continue
            decode(m, b, 100 + r)  # warm-up: graphs, kernels
            tps, waste = decode(m, b, r)
            print("| %d | %d | %.0f | %.2f%% |" % (bs, b, tps, 100 * waste), flush=True)
        if bs == 16:
            mixed(m, min(64, m.max_batch - 1), [int(c) for c in os.environ.get("CHUNKS", "128,512,2048").split(",")])
        m.close()
        del m
        gc.collect()
        if DEV == "cuda":
            torch.cuda.empty_cache()


main()

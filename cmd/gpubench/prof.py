"""Where a decode step's time goes: drives a runtime's TorchModel directly
(no Go, no protocol) and prints the torch profiler's table for decode
steps, with wall time per token.

  prof.py RUNTIME_DIR CHECKPOINT BATCH AHEAD [STEPS]

RUNTIME_DIR holds the runtime: worker.py and its package (an older one,
its modules side by side, works too with AHEAD 1).
AHEAD > 1 asks for that many tokens per step (lookahead). AHEAD 0 profiles
prefill instead: one step of BATCH prompts of 2048 / BATCH tokens each.
"""
import sys
import time

rt, path, batch, ahead = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
steps = int(sys.argv[5]) if len(sys.argv) > 5 else 16
sys.path.insert(0, rt)

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

try:
    from mlxsworker.torchrt.model import TorchModel  # noqa: E402
except ImportError:  # an older runtime: flat modules
    from torch_backend import TorchModel  # noqa: E402

if ahead == 0:
    m = TorchModel(path, {"max_batch": 16, "context_length": 2304, "device": "cuda", "dtype": "bfloat16"})

    def prefill(b, n, r, prof=None):
        ps = [[(i * 7919 + j * 104729 + r) % 120000 for j in range(n)] for i in range(b)]
        for i, p in enumerate(ps):
            m.open(i + 1, p, "")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        m.step([[i + 1, p, True, {}] for i, p in enumerate(ps)])
        torch.cuda.synchronize()
        el = time.perf_counter() - t0
        for i in range(b):
            m.free(i + 1, "")
        return el

    for cudnn in (True, False):
        torch.backends.cuda.enable_cudnn_sdp(cudnn)
        for b, n in ((1, 2048), (16, 512)):
            times = [prefill(b, n, r) for r in range(6)][1:]
            print("prefill %dx%d (cuDNN attention %s): %s ms" % (b, n, "on" if cudnn else "off",
                                                              " ".join("%.2f" % (t * 1e3) for t in times)))
            if cudnn and b == 1:
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    prefill(b, n, 9)
                ka = prof.key_averages()
                print(ka.table(sort_by="self_device_time_total", row_limit=18, max_name_column_width=60))
                print(ka.table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=60))
    sys.exit(0)
m = TorchModel(path, {"max_batch": 64, "context_length": 1024, "device": "cuda", "dtype": "bfloat16"})
prompts = [[(i * 7919 + j * 104729) % 120000 for j in range(128)] for i in range(batch)]
for i, p in enumerate(prompts):
    m.open(i + 1, p, "")


def result(r):
    """(tokens, more) of a step's result: a StepResult, or an older
    runtime's tuple."""
    if isinstance(r, tuple):
        return r[0], (r[3] if len(r) > 3 else None)
    return r.tokens, r.more


last = result(m.step([[i + 1, p, True, {}] for i, p in enumerate(prompts)]))[0]


def step():
    global last
    entry = (lambda i, t: [i + 1, [t], True, {}, ahead, 0]) if ahead > 1 else (lambda i, t: [i + 1, [t], True, {}])
    toks, mores = result(m.step([entry(i, t) for i, t in enumerate(last)]))
    if ahead > 1:
        last = [more[-1] if more else t for t, more in zip(toks, mores)]
        # the last token sampled was not fed: feed it next time
        return ahead
    last = toks
    return 1


for _ in range(4):
    step()
torch.cuda.synchronize()
t0 = time.perf_counter()
toks = 0
for _ in range(steps):
    toks += step()
torch.cuda.synchronize()
wall = time.perf_counter() - t0
print("batch %d ahead %d: %.3f ms per token step (wall, %d steps), %.0f tokens/s"
      % (batch, ahead, wall / toks * 1e3, toks, batch * toks / wall))
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    n = 0
    for _ in range(max(1, steps // 4)):
        n += step()
    torch.cuda.synchronize()
ka = prof.key_averages()
dev_total = sum(getattr(e, "self_device_time_total", 0) for e in ka if str(getattr(e, "device_type", "")).endswith("CUDA"))
kernels = sum(e.count for e in ka if str(getattr(e, "device_type", "")).endswith("CUDA"))
print("profiled %d token steps: GPU busy %.3f ms and %.0f kernels per token step"
      % (n, dev_total / 1e3 / n, kernels / n))
print(ka.table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=60))

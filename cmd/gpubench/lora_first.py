"""An adapter's first request against its later ones, in the worker
alone: drives a runtime's TorchModel (no Go, no protocol) as
examples/server loads it (the checkpoint's whole context, max_batch from
the pool, 32 slots of rank 16, CUDA graphs, prompt-step graphs and the
overlap on) with the calls its supervisor makes for one
/v1/completions request (as logged from a served run on the CPU): open,
with the adapter's "load" object on its first use; a step of the
prompt's uncached part; a step of the sampled token asking for
LOOKAHEAD tokens; free under a key. Requests, one at a time: the base
twice, a1 twice, a1 on a new prompt (resident, nothing cached), a2
twice, the base on a new prompt; the second of a pair reuses the
first's prompt blocks.

Prints per request the open's time (with the slot load's and the slot
pool's allocation in it), each step's (torch.cuda.synchronize after
each), the graphs captured (decode and prompt-step, with and without the
delta), the seconds spent capturing and in gc.collect (torch.cuda.graph
collects before each capture), and the device memory reserved. A phase
running longer than STALL seconds prints every thread's Python stack
every STALL seconds (faulthandler), so a stall shows where it waits.

  lora_first.py RUNTIME_DIR CHECKPOINT ADAPTER_DIR ADAPTER_DIR

ADAPTER_DIRs: PEFT adapters (adapter_config.json and
adapter_model.safetensors; familycheck -write adapter writes them).
Settings from the environment: CONTEXT (0: the checkpoint's), MAX_BATCH
(0: the pool's default, 256 on CUDA), SLOTS (32), RANK (16), PROMPT
(1258 tokens), LOOKAHEAD (8), STALL (10 s), PARAMS (each step's
sampling parameters as JSON; default {"t": 1}, the server's default
temperature). STANDINS=1 runs on the CPU, the graphs, kernels and
varlen call stood in by the CPU tests' plain torch
(engine/pyproc/testdata/standins.py), to check the script itself.
"""
import collections
import faulthandler
import gc
import json
import os
import re
import sys
import time

rt, path, dirs = sys.argv[1], sys.argv[2], sys.argv[3:5]
env = lambda k, d: int(os.environ.get(k, d))  # noqa: E731
CONTEXT, MAX_BATCH, SLOTS, RANK = env("CONTEXT", 0), env("MAX_BATCH", 0), env("SLOTS", 32), env("RANK", 16)
PROMPT, LOOKAHEAD, STALL, STANDINS = env("PROMPT", 1258), env("LOOKAHEAD", 8), env("STALL", 10), env("STANDINS", 0)
PARAMS = json.loads(os.environ.get("PARAMS", '{"t": 1}'))  # the sampling parameters each step sends (PROTOCOL.md)
sys.path.insert(0, rt)

import torch  # noqa: E402

from mlxsworker.torchrt import decoder, graphs, lora, prefill  # noqa: E402
from mlxsworker.torchrt.model import TorchModel  # noqa: E402
from mlxsworker.torchrt.st import SafetensorsFile  # noqa: E402

counts = collections.Counter()  # this request's captures, and seconds ("..._s") spent in what is timed


def counted(owner, name, key, seconds, synced=False):
    """Wraps owner.name: each call counts under key(*args) (None: not
    counted) and adds its time to counts[seconds], the device's work
    included where synced."""
    f = getattr(owner, name)

    def wrapped(*a, **kw):
        t = time.time()
        try:
            return f(*a, **kw)
        finally:
            if synced:
                sync()
            if key is not None:
                counts[key(*a, **kw)] += 1
            counts[seconds] += time.time() - t
    setattr(owner, name, wrapped)


def load_object(d):
    """The open request's "load" object of the PEFT adapter in d, as the
    supervisor builds it (internal/lora)."""
    cfg = json.load(open(os.path.join(d, "adapter_config.json")))
    r = int(cfg["r"])
    alpha = float(cfg.get("lora_alpha") or r)
    scale = alpha / (r ** 0.5 if cfg.get("use_rslora") else r)
    file = os.path.abspath(os.path.join(d, "adapter_model.safetensors"))
    pairs = []
    for name in SafetensorsFile(file).header:
        m = re.search(r"layers\.(\d+)\.((?:self_attn|mlp)\.\w+)\.lora_A\.weight$", name)
        if m:
            pairs.append([int(m.group(1)), m.group(2), name, name.replace("lora_A", "lora_B"), False])
    return {"file": file, "rank": r, "scale": scale, "pairs": sorted(pairs)}


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn):
    faulthandler.dump_traceback_later(STALL, repeat=True)
    t = time.time()
    try:
        out = fn()
        sync()
        return out, time.time() - t
    finally:
        faulthandler.cancel_dump_traceback_later()


def build():
    opts = {"context_length": CONTEXT, "max_batch": MAX_BATCH, "adapter_slots": SLOTS, "max_adapter_rank": RANK}
    if STANDINS:  # the CPU tests' stand-ins for the CUDA graphs, kernels and varlen call
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine/pyproc/testdata"))
        import standins
        decoder._flash_varlen = standins.flash_varlen
        graphs.record, graphs.new_pool = standins.record, object
        m = TorchModel(path, dict(opts, device="cpu"))
        m.model.kern = standins.Kern(m.model)
        m.model.varlen = m.model.sdpa = True
        m.graphs = graphs.DecodeGraphs(m.model, m.kv, m.max_batch, m.cfg.context)
        m.graphs.lora = m.adapters
        m.prefill = prefill.PrefillGraphs(m.model, m.kv, 4096, m.adapters)
        return m
    return TorchModel(path, dict(opts, device="cuda"))


def main():
    counted(graphs.DecodeGraphs, "capture", lambda _, bb, lb, lora=None: "decode%s@%d" % ("+lora" if lora else "", bb),
            "capture_s")
    counted(prefill.PrefillGraphs, "_capture", lambda _, nb, lora=False: "prompt%s@%d" % ("+lora" if lora else "", nb),
            "capture_s")
    counted(lora.Slots, "load", None, "load_s", synced=True)
    counted(lora.Slots, "_allocate", None, "allocate_s", synced=True)
    counted(gc, "collect", None, "gc_s")
    ads = [("a%d" % (i + 1), load_object(d)) for i, d in enumerate(dirs)]
    m, t = timed(build)
    print("load %.2fs: context %d, max_batch %d, kv blocks %d, graphs %s, prompt graphs %s" % (
        t, m.cfg.context, m.max_batch, m.kv.pool.n, m.graphs is not None, m.prefill is not None))
    _, t = timed(m.warm)
    print("warm %.2fs" % t)
    prompts = [[(j * 104729 + 7919 * k) % (min(m.cfg.vocab, 30000) - 10) + 5 for j in range(PROMPT)] for k in (1, 2, 3)]
    loaded = set()
    plan = [("base", 0), ("base", 0), ("a1", 0), ("a1", 0), ("a1", 1), ("a2", 0), ("a2", 0), ("base", 2)]
    for seq, (name, k) in enumerate(plan, 1):
        counts.clear()
        prompt = prompts[k]
        a = None
        if name != "base":
            slot = int(name[1:]) - 1
            a = {"name": name, "slot": slot}
            if name not in loaded:
                a["load"] = ads[slot][1]
                loaded.add(name)
        with torch.no_grad():
            reused, t_open = timed(lambda: m.open(seq, prompt, "", adapter=a))
            r1, t_prompt = timed(lambda: m.step([[seq, prompt[reused:], True, PARAMS]]))
            r2, t_decode = timed(lambda: m.step([[seq, r1.tokens, True, PARAMS, LOOKAHEAD, 0]]))
            m.free(seq, "k%d" % seq)
        mem = torch.cuda.memory_reserved() / 2**30 if torch.cuda.is_available() else 0
        cap = ", ".join("%s x%d" % (c, v) for c, v in sorted(counts.items()) if not c.endswith("_s"))
        print("%-4s p%d%s reused %5d  open %7.3fs (load %.3fs, allocate %.3fs)  prompt step %7.3fs  decode step %7.3fs  "
              "captures %.3fs (%s), gc %.3fs  reserved %.1f GiB  tokens %s" % (
                  name, k, " load" if a and "load" in a else "     ", reused, t_open, counts["load_s"], counts["allocate_s"],
                  t_prompt, t_decode, counts["capture_s"], cap or "none", counts["gc_s"], mem,
                  r1.tokens + (r2.tokens + (r2.more[0] if r2.more else []))))
    print("speculated", m.speculated)


main()

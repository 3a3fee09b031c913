"""The LoRA decode-graph paths (graphs.py, torch_backend._forward_lora and
_forward_split, lora.DevicePlan) on the CPU: DecodeGraphs' capture keeps
its step as a callable that every replay runs again (what a CUDA graph
replays), and the reference grouped GEMM stands in for
torch._grouped_mm. Sequences of two adapters and the base, prompts in
chunks beside decodes (split steps), must decode what the eager path
decodes, on graphs captured with the delta.

  python3 lora_graphs_test.py RUNTIME_DIR BASE_DIR ADAPTERS_JSON

ADAPTERS_JSON: a file holding [{"name", "load"}, ...], the open request's
adapter objects less their slot. Prints "N passed, 0 failed" or raises.
Run by TestAdapterGraphsEmulated.
"""
import json
import sys

sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402

import graphs  # noqa: E402
import lora  # noqa: E402
import torch_backend  # noqa: E402

lora._grouped_mm = lambda: lora._grouped_ref


class Replay:
    """A captured step: replay runs it again into the output buffer."""

    def __init__(self, fn, out):
        self.fn, self.out = fn, out

    def replay(self):
        self.out.copy_(self.fn())


def capture(self, bb, lb, with_lora=None):
    """DecodeGraphs.capture without CUDA: the same step and inputs."""
    io = torch.zeros(4 if with_lora else 3, bb, dtype=torch.long)
    rows = torch.arange(bb)
    kv = self.kv

    def step():
        if with_lora:
            self.model.lora = self.lora.device_plan(io[3])
        try:
            tok, pos, trows = io[0], io[1], io[2]
            kvrow = [t[trows, pos // kv.bs].long() * kv.bs + pos % kv.bs for t in kv.tables]
            return self.model.forward(tok, pos, kvrow, [("decode", rows, trows, lb, pos + 1)], kv, rows)
        finally:
            self.model.lora = None

    out = step()
    g = {"graph": Replay(step, out), "io": io, "rows": rows, "out": out, "live": 0}
    self.graphs[(bb, lb) + (("lora",) if with_lora else ())] = g
    return g


graphs.DecodeGraphs.capture = capture


def model(base, with_graphs):
    m = torch_backend.TorchModel(base, {"device": "cpu", "adapter_slots": 2, "max_adapter_rank": 8})
    if with_graphs:
        m.graphs = graphs.DecodeGraphs(m.model, m.kv, m.max_batch, m.cfg.context)
        m.graphs.lora = m.adapters
    return m


def run(m, ads):
    """Four sequences (adapter 0, the base, adapter 1, adapter 0) started
    one step apart, prompts fed 4 tokens a step, 8 tokens decoded each."""
    which = [0, None, 1, 0]
    prompts = [[(i * 37 + j * 11) % 300 + 5 for j in range(7 + 6 * i)] for i in range(4)]
    fed, out, loaded = [0] * 4, [[] for _ in prompts], set()
    for i, w in enumerate(which):
        a = None
        if w is not None:
            a = {"name": ads[w]["name"], "slot": w}
            if w not in loaded:
                a["load"] = ads[w]["load"]
                loaded.add(w)
        m.open(i, prompts[i], "", adapter=a)
    for step in range(64):
        batch = []
        for i, p in enumerate(prompts):
            if len(out[i]) >= 8 or i > step:
                continue
            if fed[i] < len(p):
                end = min(fed[i] + 4, len(p))
                batch.append([i, p[fed[i]:end], end == len(p), {}])
                fed[i] = end
            else:
                batch.append([i, [out[i][-1]], True, {}])
        if not batch:
            break
        toks, k = m.step(batch)[0], 0
        for b in batch:
            if b[2]:
                out[b[0]].append(toks[k])
                k += 1
    return out


def main():
    ads = json.load(open(sys.argv[3]))
    passed = 0
    eager = run(model(sys.argv[2], False), ads)
    gm = model(sys.argv[2], True)
    got = run(gm, ads)
    assert gm.adapters.grouped, "the grouped delta failed its check against the per-adapter one"
    assert got == eager, "graphs %r, eager %r" % (got, eager)
    passed += 1
    keys = set(gm.graphs.graphs)
    assert any("lora" in k for k in keys), "no graph captured with the delta: %r" % keys
    assert not gm.graphs.lora_broken
    passed += 1
    assert eager[0] != eager[1] and eager[0] != eager[2], "the adapters change nothing: %r" % eager
    passed += 1
    print("%d passed, 0 failed (graphs %s)" % (passed, sorted(keys)))


main()

"""The prompt-step graphs (torchrt/prefill.py) on the CPU: PrefillGraphs'
own capture and replay, with graphs.record keeping each piece as a
callable that every replay runs again (what a CUDA graph replays), and
the CUDA kernels the path needs (kernels' rope_kv, add_rms, silu_mul and
decode_attention, the varlen flash call, a mixture's fused experts) stood in by plain torch, the
same stand-ins for the eager model it is checked against. Steps of prompt
chunks (fresh, and continuing a prefix; padded to buckets of 64, 256 and
512 rows) between decode steps must give the eager path's tokens and
logprobs, and leave the KV pool as the eager path leaves it outside the
scratch block (padding rows write there alone).

  python3 prefill_graphs_test.py RUNTIME_DIR MODEL_DIR...

Each model directory is checked on its own (the Go test passes one per
family: norms, QK norms, sliding layers, partial rotary and longrope),
with the piecewise graphs and with whole-step graphs around the paged
prompt attention (its kernel stood in by prefill.attention_reference);
the first also with the KV table reallocated under whole-step graphs
(they are captured again) and the tile plan's layout.

Prints "N passed, 0 failed" or raises. Run by TestPrefillGraphsEmulated.
"""
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the runtime or in testdata
sys.path.insert(0, sys.argv[1])  # the runtime; standins.py is beside this script

import torch  # noqa: E402

from mlxsworker.torchrt import decoder, graphs, prefill  # noqa: E402
from mlxsworker.torchrt.model import TorchModel  # noqa: E402
from standins import Kern, MoEKern, flash_varlen, prompt, record, sampler  # noqa: E402


def model(path, graphs_kind):
    """The TorchModel of path on the CPU with the stand-ins; graphs_kind:
    None (eager prompt steps), "piecewise" or "whole" (prefill.py)."""
    m = TorchModel(path, {"device": "cpu", "max_batch": 8})
    m.model.kern = Kern(m.model)
    if m.model.moe is not None:  # the fused experts' path, which the graphs take
        m.model.moe.fused = MoEKern
    m.model.varlen = m.model.sdpa = True
    if graphs_kind:
        assert prefill.PrefillGraphs.supports(m.model)
        m.prefill = prefill.PrefillGraphs(m.model, m.kv, 512, paged=graphs_kind == "whole")
    return m


def run(m):
    """Seq 1's prompt in two chunks (the second continues its prefix), seq
    2's beside its first, then decodes; seq 3 joins with a 300-token
    prompt alone; all three decode. Returns (tokens, logprobs) of every
    sampling input, and the KV pool after the step of seq 3's prompt."""
    p1, p2, p3 = prompt(37, 11, 70), prompt(53, 7, 100), prompt(29, 3, 300)
    lp, out = {"l": True}, []
    step = sampler(m, out)
    m.open(1, p1, "")
    m.open(2, p2, "")
    t = step([[1, p1[:40], False, lp], [2, p2, True, lp]])  # 140 rows: bucket 256
    t = step([[1, p1[40:], True, lp]]) + t  # 30 rows, continuing: bucket 64
    last = {1: t[0], 2: t[1]}
    for _ in range(3):
        t = step([[i, [last[i]], True, lp] for i in (1, 2)])
        last = dict(zip((1, 2), t))
    m.open(3, p3, "")
    last[3] = step([[3, p3, True, lp]])[0]  # 300 rows: bucket 512
    pool = [torch.cat([m.kv.kc[li], m.kv.vc[li]]).clone() for li in range(m.cfg.layers)]
    for _ in range(4):
        t = step([[i, [last[i]], True, lp] for i in (1, 2, 3)])
        last = dict(zip((1, 2, 3), t))
    return out, pool


def check(path, kind):
    """The checks on one checkpoint with graphs of kind ("piecewise" or
    "whole"); returns how many passed."""
    passed = 0
    with torch.no_grad():
        eager, pe = run(model(path, None))
        gm = model(path, kind)
        got, pg = run(gm)
    assert [t for t, _ in got] == [t for t, _ in eager], "tokens: graphs %r, eager %r" % (got, eager)
    passed += 1
    worst = max(abs(a - b) for (_, a), (_, b) in zip(got, eager))
    assert worst < 1e-4, "logprobs differ by %g" % worst
    passed += 1
    got_buckets = gm.prefill.captured()
    assert got_buckets and set(got_buckets) <= {64, 256, 512} and len(got_buckets) == len(gm.prefill.sets), sorted(gm.prefill.sets)
    assert not gm.prefill.broken
    whole = kind == "whole"
    assert all(k[2] == whole for k in gm.prefill.sets), "graph kinds %r, want whole %s" % (sorted(gm.prefill.sets), whole)
    assert all(len(g) == (1 if whole else gm.cfg.layers + 1) for g in gm.prefill.sets.values())
    assert gm.prefill.paged == whole and (gm.prefill.table is gm.kv.table) == whole
    assert gm.stats()["prefill_whole_graphs"] == (got_buckets if whole else []), gm.stats()
    passed += 1
    # The pool outside the scratch block as the eager path left it; the
    # padding rows wrote the scratch block (its first row).
    sc = gm.kv.scratch
    for li, (a, b) in enumerate(zip(pe, pg)):
        n = a.shape[0] // 2
        keep = torch.ones(a.shape[0], dtype=torch.bool)
        keep[sc] = keep[n + sc] = False
        assert torch.allclose(a[keep], b[keep], atol=1e-5), "layer %d: KV outside the scratch block differs" % li
        assert not torch.equal(b[sc, 0], a[sc, 0]), "layer %d: no padding row wrote the scratch block" % li
    passed += 1
    print("%s, %s graphs: buckets %s, worst logprob difference %.2g" % (path, kind, got_buckets, worst))
    return passed


def check_table_grows(path):
    """Whole-step graphs read the KV table in place: when it is
    reallocated (more open sequences than its rows) their graphs are
    dropped and captured again, and the step after gives the eager path's
    tokens and logprobs."""
    def scenario(m):
        out = []
        step = sampler(m, out)
        p1 = prompt(37, 11, 30)
        m.open(1, p1, "")
        step([[1, p1, True, {"l": True}]])
        for i in range(2, 2 + 2 * m.max_batch):  # opens take table rows
            m.open(i, prompt(5 + i, i, 10), "")
        step([[2, prompt(7, 2, 10), True, {"l": True}], [3, prompt(8, 3, 10), True, {"l": True}]])
        return out
    with torch.no_grad():
        eager = scenario(model(path, None))
        gm = model(path, "whole")
        first = {}
        real = gm.prefill._capture

        def capture(nb, lora=False, whole=False):
            first.setdefault((nb, lora, whole), 0)
            first[(nb, lora, whole)] += 1
            return real(nb, lora, whole)
        gm.prefill._capture = capture
        got = scenario(gm)
    assert [t for t, _ in got] == [t for t, _ in eager], "tokens: graphs %r, eager %r" % (got, eager)
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, eager)) < 1e-4
    assert first == {(64, False, True): 2}, "captures %r, want bucket 64 twice (the table grew)" % first
    assert gm.prefill.table is gm.kv.table
    return 1


def check_tile_plan():
    """tile_plan: each chunk cut in tiles of tb tokens, positions and
    rows advancing with them, the chunk ending last first and each
    chunk's tiles from its last, unused columns of 0 tokens; None past
    the width."""
    got = prefill.tile_plan([(5, 2, 0, 7), (0, 5, 10, 3)], 2, 6)
    assert got == [[4, 2, 0, 5, 0, 0], [1, 2, 2, 2, 0, 0], [14, 12, 10, 0, 0, 0], [3, 3, 3, 7, 0, 0]], got
    got = prefill.tile_plan([(0, 4, 0, 1)], 2, 2)
    assert got == [[2, 0], [2, 2], [2, 0], [1, 1]], got
    assert prefill.tile_plan([(0, 5, 10, 3)], 2, 2) is None
    assert prefill.tile_tokens(32, 8, 64) == 32 and prefill.tile_tokens(24, 8, 128) == 32 and prefill.tile_tokens(8, 8, 128) == 128
    assert prefill.tile_tokens(8, 4, 256) == 32 and prefill.tile_tokens(64, 1, 256) == 1
    return 1


def main():
    decoder._flash_varlen = flash_varlen
    graphs.record, graphs.new_pool = record, lambda: object()
    passed = check_tile_plan()
    passed += sum(check(path, kind) for path in sys.argv[2:] for kind in ("piecewise", "whole"))
    passed += check_table_grows(sys.argv[2])
    print("%d passed, 0 failed" % passed)


main()

"""The LoRA graph paths (torchrt/graphs.py and prefill.py,
TorchModel._forward_lora and _forward_split, lora.DensePlan) on the CPU: DecodeGraphs' own capture
runs, with its CUDA part (_record) keeping the step as a callable that
every replay runs again (what a CUDA graph replays). Sequences of two
adapters and the base, prompts in chunks beside decodes (split steps),
must decode what the eager path decodes, on graphs captured with the
delta; a capture that fails (of the base's graphs or of those with the
delta) leaves that kind's steps eager, with the same tokens; the two
kinds capture into pools of their own, new ones after the KV table
grows. DensePlan and Plan give the same delta on random slots;
SegmentPlan, its kernels stood in by plain torch, serves the same tokens,
and its load-time check keeps kernels that agree and turns off one that
adds nothing. Prompt steps with adapter rows (prefill.py: several chunks of the base and two
adapters in one step, chunks beside decodes) replay the prompt-step
graphs captured with the delta, the CUDA kernels stood in by plain torch
(standins.py), and give the eager path's tokens and logprobs (with the
segmented kernels stood in too, the rows sorted once a step), base-only
prompt steps their own graphs, with the next decode step speculated
behind each step (overlap) and without (the decodes beside chunks on
their graphs: split steps); a failed capture with the delta leaves those
steps eager with the same tokens. Under tensor parallel 2 (two
processes of this script in a gloo group, each rank's slots its share)
the graphs and the eager path decode what one rank decodes.

  python3 lora_graphs_test.py RUNTIME_DIR BASE_DIR ADAPTERS_JSON

ADAPTERS_JSON: a file holding [{"name", "load"}, ...], the open request's
adapter objects less their slot. Prints "N passed, 0 failed" or raises.
Run by TestAdapterGraphsEmulated.
"""
import json
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ beside the runtime or in testdata
sys.path.insert(0, sys.argv[1])  # the runtime; standins.py is beside this script

import torch  # noqa: E402

from mlxsworker.settings import Settings  # noqa: E402
from mlxsworker.torchrt import decoder, graphs, lora, prefill, tp  # noqa: E402
from mlxsworker.torchrt.model import TorchModel  # noqa: E402
from standins import Kern, flash_varlen  # noqa: E402
from standins import record as standin_record  # noqa: E402


class Replay:
    """A captured step: replay runs it again into the output buffer."""

    def __init__(self, fn, out):
        self.fn, self.out = fn, out

    def replay(self):
        self.out.copy_(self.fn())


FAIL = set()  # the kinds ("base", "lora") whose capture raises, as a CUDA capture can


def record(self, step, kind):
    """DecodeGraphs._record without CUDA."""
    if kind in FAIL:
        raise RuntimeError("injected capture failure (%s)" % kind)
    out = step()
    return Replay(step, out), out


real_record = graphs.DecodeGraphs._record
graphs.DecodeGraphs._record = record


def pools(base, ads):
    """DecodeGraphs' own _record on CPU stand-ins for the pools and the
    capture: the base's graphs share one pool, those with the delta
    another, and once the KV table grows every graph is dropped and the
    next captures take new pools."""
    made, used = [], {}

    def new_pool():
        made.append(object())
        return made[-1]

    def rec(step, pool):
        out = step()
        used[id(out)] = pool
        return Replay(step, out), out

    saved = graphs.new_pool, graphs.record, graphs.DecodeGraphs._record
    graphs.new_pool, graphs.record, graphs.DecodeGraphs._record = new_pool, rec, real_record
    try:
        m = model(base, True)
        run(m, ads)
        by = {k: used[id(g["out"])] for k, g in m.graphs.graphs.items()}
        lp = {p for k, p in by.items() if "lora" in k}
        bp = {p for k, p in by.items() if "lora" not in k}
        assert len(lp) == 1 and len(bp) == 1 and lp != bp, by
        assert len(made) == 2, made
        m.kv.table_grown = True
        m.graphs.run([5], [3], [0])  # a base step of one row on the scratch table row
        assert list(m.graphs.graphs) == [(1, 256)], list(m.graphs.graphs)
        assert len(made) == 3 and used[id(m.graphs.graphs[(1, 256)]["out"])] is made[2], "no new pool after the table grew"
        assert not m.graphs.kv.table_grown
    finally:
        graphs.new_pool, graphs.record, graphs.DecodeGraphs._record = saved


def model(base, with_graphs, group=None, slots=2):
    m = TorchModel(base, {"device": "cpu", "adapter_slots": slots, "max_adapter_rank": 8}, group=group)
    if with_graphs:
        m.graphs = graphs.DecodeGraphs(m.model, m.kv, m.max_batch, m.cfg.context)
        m.graphs.lora = m.adapters
    return m


def run(m, ads):
    """Four sequences (adapter 0, the base, adapter 1, adapter 0) started
    one step apart, prompts fed 4 tokens a step, 8 tokens decoded by each
    adapter's and 24 by the base's (its last steps are the base's alone)."""
    which, want = [0, None, 1, 0], [8, 24, 8, 8]
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
            if len(out[i]) >= want[i] or i > step:
                continue
            if fed[i] < len(p):
                end = min(fed[i] + 4, len(p))
                batch.append([i, p[fed[i]:end], end == len(p), {}])
                fed[i] = end
            else:
                batch.append([i, [out[i][-1]], True, {}])
        if not batch:
            break
        toks, k = m.step(batch).tokens, 0
        for b in batch:
            if b[2]:
                out[b[0]].append(toks[k])
                k += 1
    return out


def dense_vs_plan(base):
    """DensePlan against Plan on random weights in every slot (two
    empty), rows of every slot and the base interleaved, through every
    projection of every layer."""
    m = TorchModel(base, {"device": "cpu", "adapter_slots": 5, "max_adapter_rank": 12})
    s = m.adapters
    s._allocate()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for li in range(len(s.A)):
            for P, A in s.A[li].items():
                A[:3] = torch.randn(A[:3].shape, generator=g) * 0.1
                for B in s.B[li][P]:
                    B[:3] = torch.randn(B[:3].shape, generator=g) * 0.1
        idx = [1, 0, 2, 2, 3, 0, 1, 4, 0, 0, 5, 3] * 3
        dense = s.device_plan(torch.tensor(idx))
        plan = lora.Plan(s, [(v, torch.tensor([i for i, w in enumerate(idx) if w == v])) for v in range(1, 6) if v in idx])
        n = 0
        for li, pr in enumerate(s.proj):
            for P, (width, mods) in pr.items():
                x = torch.randn(len(idx), width, generator=g)
                y0 = torch.randn(len(idx), sum(o for _, o in mods), generator=g)
                got, want = dense.add(y0.clone(), x, li, P), plan.add(y0.clone(), x, li, P)
                assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), "%d %s: max diff %g" % (li, P, (got - want).abs().max())
                assert not torch.equal(want, y0), "%d %s: the delta is zero" % (li, P)
                base_rows = torch.tensor([v in (0, 4, 5) for v in idx])
                assert torch.equal(got[base_rows], y0[base_rows]), "%d %s: rows of empty slots changed" % (li, P)
                n += 1
    assert n >= 4 * len(s.proj)


class Segmented:
    """A stand-in for lora_triton (SegmentPlan's kernels) in plain torch:
    each slot's rows from the segments lora.segments gave, checked for
    consistency (every tile numbering); noop: adds nothing, as a broken
    kernel might; fail_rows: raises for steps of that many rows, as a
    variant that does not compile would. Its variants change at 17 and
    65 rows."""
    ROW_TILES = (16, 64)

    def __init__(self, noop=False, fail_rows=None):
        self.noop, self.calls, self.fail_rows, self.rows = noop, 0, fail_rows, set()

    @staticmethod
    def variants(n, A, B, offsets):
        return (n > 16, n > 64)

    def delta(self, y, x, A, B, offsets, order, start, tiles):
        self.calls += 1
        self.rows.add(x.shape[0])
        if x.shape[0] == self.fail_rows:
            raise RuntimeError("out of resource: shared memory")
        S = A.shape[0]
        counts = (start[1:] - start[:-1]).tolist()
        assert start[0] == 0 and len(counts) == S and sum(counts) <= x.shape[0], start
        for bm, t in tiles.items():
            assert t.tolist() == [sum(-(-c // bm) for c in counts[:i]) for i in range(S + 1)], (bm, t, counts)
        if self.noop:
            return y
        ends = offsets[1:] + [B.shape[2]]
        for k in range(S):
            rows = order[int(start[k]) : int(start[k + 1])]
            for j, (a, e) in enumerate(zip(offsets, ends)):
                y[rows, a:e] += ((x[rows] @ A[k, j].T) @ B[k][:, a:e]).to(y.dtype)
        return y


def segmented(base, ads, eager):
    """SegmentPlan (the kernels stood in by Segmented) serving every
    adapter step, on the graphs and eagerly: the eager path's tokens; the
    load-time check keeps kernels that agree, turns a kernel that adds
    nothing off (the dense delta then serves the same tokens), clears the
    slot it borrowed, and launches each of the kernels' variants up to
    the step's rows (turning them off where one fails)."""
    n = 0
    for noop, fail_rows in ((False, None), (True, None), (False, 17)):
        for with_graphs in (True, False):
            m = model(base, with_graphs, slots=3)  # the run fills slots 0 and 1; the check borrows 2
            kern = Segmented(noop, fail_rows)
            m.adapters.kern, m.adapters.rows = kern, 100
            got = run(m, ads)
            assert got == eager, "segmented (noop %s, fail at %s, graphs %s): %r, eager %r" % (noop, fail_rows, with_graphs, got, eager)
            s = m.adapters
            works = not noop and fail_rows is None
            assert s.checked and s.fused == works and kern.calls > 0, (noop, fail_rows, s.checked, s.fused, kern.calls)
            if not noop:  # the check launched each variant up to the step's rows (the first of each)
                assert {1, 17} <= kern.rows and (fail_rows or 65 in kern.rows), sorted(kern.rows)
            assert all(float(t[s.n - 1].abs().sum()) == 0 for pr in s.A + s.Bcat for t in pr.values()), "the check's slot kept weights"
            if with_graphs:
                assert any("lora" in k for k in m.graphs.graphs) and not m.graphs.lora_broken
            n += 1
    return n


def prompt_model(base, with_graphs, overlap=True, whole=False):
    """A model with two adapter slots on the CUDA paths' stand-ins (the
    kernels, varlen attention); with_graphs: the decode graphs and the
    prompt-step graphs, else every step eager; overlap: the settings'
    (the next decode step speculated behind each step, on the graphs);
    whole: the prompt-step graphs of whole steps around the paged prompt
    attention (prefill.py), else piecewise."""
    m = TorchModel(base, {"device": "cpu", "adapter_slots": 2, "max_adapter_rank": 8, "max_batch": 8}, Settings(overlap=overlap))
    m.model.kern = Kern(m.model)
    m.model.varlen = m.model.sdpa = True
    if with_graphs:
        m.graphs = graphs.DecodeGraphs(m.model, m.kv, m.max_batch, m.cfg.context)
        m.graphs.lora = m.adapters
        assert prefill.PrefillGraphs.supports(m.model)
        m.prefill = prefill.PrefillGraphs(m.model, m.kv, 512, m.adapters, paged=whole)
    return m


def prompt_steps(m, ads):
    """Prompt steps mixing the base and two adapters: three chunks in one
    step (seq 0 of adapter 0 and seq 1 of the base start the same prompt,
    seq 2 of adapter 1 all of its own), their rest beside seq 2's decode,
    seq 3 of adapter 0 joining beside decodes, then seq 4 of the base
    alone beside them, and decodes. Returns every sampled (token,
    logprob) in order."""
    p = [[(j * 37 + 11) % 300 + 5 for j in range(70)]] * 2
    p += [[(j * 53 + 7 * i) % 300 + 5 for j in range(n)] for i, n in ((2, 100), (3, 40), (4, 50))]
    which = [0, None, 1, 0, None]
    lp, out, last = {"l": True}, [], {}

    def open_(i):
        w = which[i]
        a = None if w is None else {"name": ads[w]["name"], "slot": w, "load": ads[w]["load"]}
        m.open(i, p[i], "", adapter=a)

    def step(batch):
        r = m.step(batch)
        out.extend(zip(r.tokens, r.logprobs))
        last.update(zip([b[0] for b in batch if b[2]], r.tokens))

    def decodes(seqs):
        return [[i, [last[i]], True, lp] for i in seqs]

    for i in range(3):
        open_(i)
    step([[0, p[0][:40], False, lp], [1, p[1][:40], False, lp], [2, p[2], True, lp]])
    step([[0, p[0][40:], True, lp], [1, p[1][40:], True, lp]] + decodes([2]))
    step(decodes([0, 1, 2]))
    open_(3)
    step([[3, p[3], True, lp]] + decodes([0, 1, 2]))
    open_(4)
    step([[4, p[4], True, lp]] + decodes([0, 1, 2, 3]))
    for _ in range(3):
        step(decodes(range(5)))
    return out


def prompt_graphs(base, ads):
    """prompt_steps on the prompt-step graphs (with the delta for steps
    with adapter rows) against every step eager, with the overlap (the
    decodes beside chunks speculated) and without (split steps); then
    with the capture with the delta failing, piecewise and whole. Returns
    the checks passed."""
    saved = decoder._flash_varlen, graphs.record, graphs.new_pool, prefill.PrefillGraphs._capture, prefill.segments
    decoder._flash_varlen, graphs.record, graphs.new_pool = flash_varlen, standin_record, lambda: object()
    try:
        with torch.no_grad():
            eager = prompt_steps(prompt_model(base, False), ads)
            assert abs(eager[2][1] - eager[3][1]) > 1e-3, "adapter 0 and the base on one prompt: %r" % eager[2:4]
            for overlap, whole in ((True, False), (False, False), (True, True), (False, True)):
                gm = prompt_model(base, True, overlap, whole)
                runs, splits = spy(gm.prefill, "run"), spy(gm, "_forward_split")
                same_as(prompt_steps(gm, ads), eager, "prompt graphs, overlap %s, whole %s" % (overlap, whole))
                pf, delta = gm.prefill, [len(a) > 5 and a[5] is not None for a, _, out in runs if out is not None]
                assert pf.captured(lora=True) and pf.captured() and not pf.broken and not pf.lora_broken, sorted(pf.sets)
                assert pf.paged == whole and all(k[2] == whole for k in pf.sets), sorted(pf.sets)
                assert delta.count(True) >= 3 and delta.count(False) >= 1, "prompt-graph runs with the delta: %r" % delta
                assert gm.stats()["prefill_lora_graphs"] == pf.captured(lora=True), gm.stats()
                if overlap:  # the speculated decodes of adapter rows ran beside later steps' chunks
                    assert gm.speculated["beside"] > 0, gm.speculated
                else:  # decodes on the graphs with the delta, chunks on the prompt graphs, in one step
                    assert any(kw.get("lora") and out is not None for _, kw, out in splits), "no split step with adapters"

            # The segmented kernels (stood in) on the prompt-step graphs: the
            # eager path's tokens, the rows sorted once a step by the first
            # piece, not by every piece.
            for whole in (False, True):
                sm = prompt_model(base, True, whole=whole)
                kern = Segmented()
                sm.adapters.kern = kern
                sorts, runs = spy(prefill, "segments"), spy(sm.prefill, "run")
                try:
                    same_as(prompt_steps(sm, ads), eager, "prompt graphs, segmented, whole %s" % whole)
                finally:
                    prefill.segments = saved[4]
                replays = sum(1 for a, _, out in runs if out is not None and a[5] is not None)
                sets = len([k for k in sm.prefill.sets if k[1]])
                assert sm.adapters.fused and kern.calls > 0 and replays >= 3, (sm.adapters.fused, kern.calls, replays)
                assert replays <= len(sorts) <= replays + 2 * sets, "%d sorts for %d replays of %d sets" % (len(sorts), replays, sets)
                # The buffers the graphs read outlive the capture: the graphs keep no tensor alive.
                assert all((k[0], k[2]) in sm.prefill.segs for k in sm.prefill.sets if k[1]), (sorted(sm.prefill.sets), sorted(sm.prefill.segs))

            def failing(self, nb, lora=False, whole=False):
                if lora:
                    raise RuntimeError("injected capture failure (prompt graphs with the delta)")
                return saved[3](self, nb, lora, whole)
            prefill.PrefillGraphs._capture = failing
            fm = prompt_model(base, True)
            runs = spy(fm.prefill, "run")
            same_as(prompt_steps(fm, ads), eager, "prompt graphs with the delta failing")
            pf = fm.prefill
            assert pf.lora_broken and not pf.broken and not pf.captured(lora=True) and pf.captured(), sorted(pf.sets)
            assert all(a[5] is None for a, _, out in runs if out is not None), "a run with the delta"

            # A whole-step capture with the delta failing (a Triton build
            # error, say): steps with adapters take the piecewise graphs with
            # the delta, the base's keep their whole-step graphs.
            def failing_whole(self, nb, lora=False, whole=False):
                if lora and whole:
                    raise ValueError("injected build failure (whole-step graphs with the delta)")
                return saved[3](self, nb, lora, whole)
            prefill.PrefillGraphs._capture = failing_whole
            wm = prompt_model(base, True, whole=True)
            same_as(prompt_steps(wm, ads), eager, "whole-step graphs with the delta failing")
            pf = wm.prefill
            assert pf.lora_whole_broken and pf.paged and not pf.lora_broken and not pf.broken, sorted(pf.sets)
            kinds = {k[1:] for k in pf.sets}
            assert kinds == {(False, True), (True, False)}, "graph kinds %r, want the base's whole, the delta's piecewise" % kinds
    finally:
        decoder._flash_varlen, graphs.record, graphs.new_pool, prefill.PrefillGraphs._capture, prefill.segments = saved
    return 5


def spy(obj, name):
    """Wraps obj's method name: the returned list gets (args, keywords,
    result) of every call."""
    calls, f = [], getattr(obj, name)

    def wrapped(*args, **kw):
        out = f(*args, **kw)
        calls.append((args, kw, out))
        return out
    setattr(obj, name, wrapped)
    return calls


def same_as(got, want, what):
    assert [t for t, _ in got] == [t for t, _ in want], "%s: tokens %r, eager %r" % (what, got, want)
    worst = max(abs(a - b) for (_, a), (_, b) in zip(got, want))
    assert worst < 1e-4, "%s: logprobs differ by %g" % (what, worst)


TP = 2


def tp_ranks(base, spec, eager):
    """Runs this script as TP ranks (tp_rank) and waits for them: each
    must decode eager, one rank's tokens, eagerly and on graphs."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(eager, f)
        f.flush()
        port = tp._free_port()
        ps = [subprocess.Popen([sys.executable, sys.argv[0], sys.argv[1], base, spec, "--tp-rank", str(r), str(port), f.name])
              for r in range(TP)]
        codes = [p.wait(timeout=300) for p in ps]
    assert codes == [0] * TP, "tensor-parallel ranks exited with %r" % codes


def tp_rank(base, ads, rank, port, want):
    """One rank of tp_ranks: its share of the model and of the slots, the
    eager path, then the graphs captured with the delta."""
    group = tp._join(rank, TP, port, 0, Settings())
    eager = run(model(base, False, group), ads)
    assert eager == want, "rank %d, eager: %r, one rank %r" % (rank, eager, want)
    gm = model(base, True, group)
    got = run(gm, ads)
    assert got == want, "rank %d, graphs: %r, one rank %r" % (rank, got, want)
    assert any("lora" in k for k in gm.graphs.graphs) and not gm.graphs.lora_broken, "rank %d: no graph with the delta" % rank


def main():
    ads = json.load(open(sys.argv[3]))
    if len(sys.argv) > 4 and sys.argv[4] == "--tp-rank":
        tp_rank(sys.argv[2], ads, int(sys.argv[5]), int(sys.argv[6]), json.load(open(sys.argv[7])))
        return
    passed = 0
    dense_vs_plan(sys.argv[2])
    passed += 1
    eager = run(model(sys.argv[2], False), ads)
    gm = model(sys.argv[2], True)
    got = run(gm, ads)
    assert got == eager, "graphs %r, eager %r" % (got, eager)
    passed += 1
    keys = set(gm.graphs.graphs)
    assert any("lora" in k for k in keys), "no graph captured with the delta: %r" % keys
    assert any("lora" not in k for k in keys), "no base graph captured: %r" % keys
    assert not gm.graphs.lora_broken and not gm.graphs.broken
    passed += 1
    assert eager[0] != eager[1] and eager[0] != eager[2], "the adapters change nothing: %r" % eager
    passed += 1
    passed += segmented(sys.argv[2], ads, eager)
    pools(sys.argv[2], ads)
    passed += 1
    passed += prompt_graphs(sys.argv[2], ads)
    for kinds in ({"lora"}, {"base"}, {"base", "lora"}):
        FAIL.clear()
        FAIL.update(kinds)
        fm = model(sys.argv[2], True)
        got = run(fm, ads)
        assert got == eager, "capture of %s failing: %r, eager %r" % (kinds, got, eager)
        # Once the base's kind is broken, the delta's graphs are not tried.
        if kinds == {"lora"}:
            assert fm.graphs.lora_broken, kinds
        if "lora" not in kinds:
            assert not fm.graphs.lora_broken, kinds
        assert fm.graphs.broken == ("base" in kinds), kinds
        fk = set(fm.graphs.graphs)
        assert "lora" not in kinds or not any("lora" in k for k in fk), (kinds, fk)
        assert any("lora" not in k for k in fk) != ("base" in kinds), (kinds, fk)
        passed += 1
    FAIL.clear()
    tp_ranks(sys.argv[2], sys.argv[3], eager)
    passed += 1
    print("%d passed, 0 failed (graphs %s)" % (passed, sorted(keys)))


main()

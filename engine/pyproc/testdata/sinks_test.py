"""gpt_oss's attention sinks on the CUDA fast paths, run on the CPU.

First the math: gptoss.with_sinks (a softmax's output rescaled by its
log-sum-exp L: out * sigmoid(L - s)) and the stand-in decode kernel's
softmax (exp(s - m) plus exp(sink - m) in the denominator) against an
explicit softmax with a sink column, on causal rows, a short window, a
fully masked row (flash's +inf log-sum-exp and torch's -inf) and sinks
far above and below the scores; and the stand-in varlen call (standins.py)
through with_sinks on packed sequences with and without a window.

Then a tiny gpt_oss checkpoint served four ways: the plain torch path
(the reference), and with the CUDA paths stood in by plain torch
(standins.py): the kernels, the varlen prompt attention, the decode
graphs and the speculated next step (overlap); the kernels and varlen
eagerly, so one-token inputs and prompt chunks share one pass; and the
plain attention in decode graphs. Chunked prompts (one continuing its
prefix), steps mixing prompts with decodes and decoding past the sliding
window must give the reference's tokens, and its logprobs within 1e-4;
the stand-ins must have run with the sinks.

  python3 sinks_test.py RUNTIME_DIR MODEL_DIR

Prints "N passed, 0 failed" or raises. Run by TestGptOssSinksEmulated.
"""
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the runtime or in testdata
sys.path.insert(0, sys.argv[1])  # the runtime; standins.py is beside this script

import torch  # noqa: E402

import standins  # noqa: E402
from mlxsworker.settings import Settings  # noqa: E402
from mlxsworker.torchrt import decoder, gptoss, graphs  # noqa: E402
from mlxsworker.torchrt.model import TorchModel  # noqa: E402

INF = float("inf")


def explicit(s, v, sinks):
    """Attention of scores s [H, T, L] (-inf where masked) over v [H, L,
    hd] with each head's sink as one more softmax column."""
    return gptoss.softmax_sinks(s, sinks.view(-1, 1, 1)) @ v


def close(a, b, what, tol=1e-5):
    err = (a - b).abs().max().item()
    assert err <= tol, "%s: off by %g" % (what, err)


def check_math():
    """with_sinks and the stand-in kernel's softmax against explicit sink
    columns. Returns how many checks passed."""
    g = torch.Generator().manual_seed(1)
    H, T, L, hd = 4, 6, 9, 8
    s = torch.randn(H, T, L, generator=g) * 3
    v = torch.randn(H, L, hd, generator=g)
    sinks = torch.tensor([-30.0, 0.5, 2.0, 30.0])  # far below, beside and far above the scores
    kp, qp = torch.arange(L).unsqueeze(0), torch.arange(L - T, L).unsqueeze(1)
    masks = {"causal": kp <= qp, "window 2": (kp <= qp) & (kp > qp - 2)}
    none = masks["causal"].clone()
    none[0] = False  # a row that sees no key
    masks["a fully masked row"] = none
    passed = 0
    for name, ok in masks.items():
        sm = s.masked_fill(~ok, -INF)
        want = explicit(sm, v, sinks)
        out = (torch.softmax(sm, -1).nan_to_num(0.0) @ v).transpose(0, 1)  # [T, H, hd], zeros where no key
        lse = torch.logsumexp(sm, -1).transpose(0, 1)
        close(gptoss.with_sinks(out, lse, sinks).transpose(0, 1), want, "with_sinks, " + name)
        flash = lse.masked_fill(torch.isinf(lse), INF)  # flash reports +inf for a row that saw no key
        close(gptoss.with_sinks(out, flash, sinks).transpose(0, 1), want, "with_sinks (+inf), " + name)
        if name == "a fully masked row":
            assert not want[:, 0].any(), "a row that sees no key attends to the sink alone"
        passed += 2
    for name, ok in list(masks.items())[:2]:  # the decode kernel's rows see their own key
        sm = s[:, -1:].masked_fill(~ok[-1:], -INF)
        close(standins._decode_softmax(sm, sinks) @ v, explicit(sm, v, sinks), "decode softmax, " + name)
        passed += 1
    # The stand-in varlen call on two packed sequences (fresh, and the
    # last 3 queries of 11 keys), with a window that bites and without.
    K, rep = 2, 2
    lens = [(5, 5), (3, 11)]
    q = torch.randn(sum(t for t, _ in lens), K * rep, hd, generator=g)
    k = torch.randn(sum(n for _, n in lens), K, hd, generator=g)
    vv = torch.randn(sum(n for _, n in lens), K, hd, generator=g)
    cu = lambda xs: torch.tensor([0] + [sum(xs[: i + 1]) for i in range(len(xs))], dtype=torch.int32)
    cq, ck = cu([t for t, _ in lens]), cu([n for _, n in lens])
    for window in (0, 3):
        got = gptoss.with_sinks(*standins.flash_varlen(q, k, vv, cq, ck, 5, 11, 0.3, window, lse=True), sinks)
        for i, (t, n) in enumerate(lens):
            qq, kk, vs = q[cq[i] : cq[i + 1]], k[ck[i] : ck[i + 1]], vv[ck[i] : ck[i + 1]]
            kk, vs = (x.repeat_interleave(rep, 1).transpose(0, 1) for x in (kk, vs))
            sm = (qq.transpose(0, 1) @ kk.transpose(1, 2)) * 0.3
            sm = sm.masked_fill(~decoder._allowed(t, n, n - t, window, "cpu"), -INF)
            close(got[cq[i] : cq[i + 1]].transpose(0, 1), explicit(sm, vs, sinks), "varlen, window %d, sequence %d" % (window, i))
            passed += 1
    return passed


CALLS = {"decode": 0, "varlen": 0}


def counted_kern(m):
    """The stand-in kernels for m, counting decode attention with sinks."""
    kern = standins.Kern(m)
    decode = kern.decode_attention

    def decode_attention(*a, sinks=None, **kw):
        assert sinks is not None, "decode attention without gpt_oss's sinks"
        CALLS["decode"] += 1
        return decode(*a, sinks=sinks, **kw)

    kern.decode_attention = decode_attention
    return kern


def flash_varlen(*a, lse=False, **kw):
    assert lse, "the varlen call without the log-sum-exp the sinks need"
    CALLS["varlen"] += 1
    return standins.flash_varlen(*a, lse=lse, **kw)


def model(path, kernels, with_graphs, overlap=False):
    m = TorchModel(path, {"device": "cpu", "max_batch": 8}, Settings(overlap=overlap))
    assert not m.model.sdpa and not m.model.varlen and m.model.kern is None
    if kernels:
        m.model.kern = counted_kern(m.model)
        m.model.varlen = True
    if with_graphs:
        m.graphs = graphs.DecodeGraphs(m.model, m.kv, m.max_batch, m.cfg.context)
        assert m.graphs.fast == kernels
    return m


def run(m):
    """Seq 1's 70-token prompt in two chunks (the second continues its
    prefix), seq 2's 100 beside the first; both decode; seq 3's 30-token
    prompt joins beside their decodes; all three decode past two 16-token
    windows. Returns every (token, logprob) sampled."""
    p1, p2, p3 = (standins.prompt(a, b, n) for a, b, n in ((37, 11, 70), (53, 7, 100), (29, 3, 30)))
    lp, out = {"l": True}, []
    step = standins.sampler(m, out)
    m.open(1, p1, "")
    m.open(2, p2, "")
    t = step([[1, p1[:40], False, lp], [2, p2, True, lp]])
    last = {2: t[0]}
    last[1] = step([[1, p1[40:], True, lp]])[0]
    for _ in range(3):
        last = dict(zip((1, 2), step([[i, [last[i]], True, lp] for i in (1, 2)])))
    m.open(3, p3, "")
    last = dict(zip((1, 2, 3), step([[1, [last[1]], True, lp], [2, [last[2]], True, lp], [3, p3, True, lp]])))
    for _ in range(36):
        last = dict(zip((1, 2, 3), step([[i, [last[i]], True, lp] for i in (1, 2, 3)])))
    return out


def check_served(path):
    """The three fast configurations against the plain path. Returns how
    many checks passed."""
    decoder._flash_varlen = flash_varlen
    graphs.record, graphs.new_pool = standins.record, lambda: object()
    passed = 0
    with torch.no_grad():
        want = run(model(path, False, False))
        for name, kernels, with_graphs, overlap in (("kernels, varlen, decode graphs, overlap", True, True, True),
                                                    ("kernels and varlen, eager", True, False, False),
                                                    ("plain attention in decode graphs", False, True, False)):
            CALLS.update(decode=0, varlen=0)
            m = model(path, kernels, with_graphs, overlap)
            got = run(m)
            at = next((i for i, (a, b) in enumerate(zip(got, want)) if a[0] != b[0]), None)
            assert at is None, "%s: sample %d: %r, plain %r" % (name, at, got[at:at + 4], want[at:at + 4])
            worst = max(abs(a - b) for (_, a), (_, b) in zip(got, want))
            assert worst < 1e-4, "%s: logprobs differ by %g" % (name, worst)
            if kernels:
                assert CALLS["decode"] and CALLS["varlen"], (name, CALLS)
            if with_graphs:
                assert m.graphs.graphs and not m.graphs.broken, name
            if overlap:
                assert m.stats()["speculated"]["chained"] > 0, (name, m.stats()["speculated"])
            print("%s: %d tokens, worst logprob difference %.2g, calls %s" % (name, len(got), worst, CALLS))
            passed += 1
    return passed


def main():
    passed = check_math() + check_served(sys.argv[2])
    print("%d passed, 0 failed" % passed)


main()

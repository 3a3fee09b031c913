"""The speculated next decode step (lookahead.Spec behind every step,
settings.overlap) on the CPU: the decode graphs kept as callables that
every replay runs again and the Triton kernels stood in by plain torch
(standins.py), so the device chain, the speculation after ordinary and
mixed steps, its use beside prompt chunks and its discarding all run.
The same scenario with the overlap off must give the same tokens and
logprobs: sequences joining with chunked prompts beside decoding ones,
greedy and seeded temperature sampling with logprobs, a sequence leaving
mid-decode, a caller feeding a token it was not given, a repetition
penalty (which never runs ahead) for some steps; and the counts must show
speculations used whole, used beside prompt chunks and discarded. The
scenario run through the protocol's Worker as a pipelining supervisor
sends it (every decode row that feeds the token just sampled as a null
row, every step naming the one before in "after") must give the same
tokens and logprobs and use the speculations exactly as often. A
step's "last" sequences are left out of the speculated step (last_rows).

  python3 overlap_test.py RUNTIME_DIR MODEL_DIR...

Each model directory is checked on its own (the Go test passes Llama's
and Gemma 3's: sliding layers give blocks back between steps while a
speculated step is queued).

Prints "N passed, 0 failed" or raises. Run by TestOverlapEmulated.
"""
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the runtime or in testdata
sys.path.insert(0, sys.argv[1])  # the runtime; standins.py is beside this script

import torch  # noqa: E402

from mlxsworker.protocol import Worker  # noqa: E402
from mlxsworker.settings import Settings  # noqa: E402
from mlxsworker.torchrt import graphs  # noqa: E402
from mlxsworker.torchrt.model import TorchModel  # noqa: E402
from standins import Kern, MoEKern, record  # noqa: E402


def model(path, overlap, **opts):
    m = TorchModel(path, dict({"device": "cpu", "max_batch": 8}, **opts), Settings(overlap=overlap))
    m.model.kern = Kern(m.model)
    if m.model.moe is not None:  # the fused experts' path: their k choices summed by add_rms in decode steps
        m.model.moe.fused = MoEKern
    m.graphs = graphs.DecodeGraphs(m.model, m.kv, m.max_batch, m.cfg.context)
    assert m.graphs.fast
    return m


PARAMS = [{"l": True}, {"t": 0.9, "k": 40, "s": 7, "l": True}, {}, {"t": 0.7, "p": 0.9, "s": 3}]


class Direct:
    """Steps and frees on the model itself, every token explicit."""

    def __init__(self, m):
        self.m = m

    def step(self, batch, prev):
        r = self.m.step(batch)
        return r.tokens, r.logprobs

    def free(self, seq):
        self.m.free(seq, "")


class Piped:
    """Steps and frees through the protocol's Worker, as a pipelining
    supervisor sends them: a row feeding the token its sequence just
    sampled goes as null, and each step names the one before it."""

    def __init__(self, m):
        self.w = Worker(None, None, None, False)
        self.w.models["m"] = m
        self.id, self.last = 0, None

    def step(self, batch, prev):
        self.id += 1
        batch = [[b[0], None] + b[2:] if b[0] in prev else b for b in batch]
        req = {"id": self.id, "model": "m", "batch": batch}
        ghost = self.id == 5 and len(batch) > 1
        if ghost:
            # The first chunk of a sequence whose open failed, sent behind
            # it: dropped, its output -1, the rest of the step as without it.
            batch.insert(1, [99, [7, 8, 9], True, {}])
            req["opening"] = [99]
        if self.last is not None:
            req["after"] = self.last
        r = self.w.step(req)
        self.last = self.id
        toks, lps = r["tokens"], r.get("logprobs", [0.0] * len(r["tokens"]))
        if ghost:
            k = 1 if batch[0][2] else 0
            assert toks[k] == -1 and lps[k] == 0.0, (toks, lps)
            del toks[k], lps[k]
        return toks, lps

    def free(self, seq):
        self.id += 1
        self.w.free({"id": self.id, "model": "m", "seq": seq, "key": ""})


def run(m, via=Direct):
    """Four sequences join two steps apart (prompts fed 5 tokens a step);
    at step 7 sequence 2 is fed a token it was not given; sequence 1
    leaves after step 9; at steps 11 to 15 sequence 3 takes a repetition
    penalty; the others decode until step 39 (past two blocks of a
    16-token window). Returns every sampled (token, logprob)."""
    via = via(m)
    prompts = [[(i * 131 + j * 37 + 11) % 300 + 5 for j in range(n)] for i, n in enumerate((9, 4, 13, 6))]
    fed, last, open_, out = [0] * 4, [None] * 4, [False] * 4, []
    for step in range(40):
        batch, prev = [], set()
        for i, p in enumerate(prompts):
            if step == 2 * i and not open_[i] and step < 10:
                m.open(i + 1, p, "")
                open_[i] = True
            if not open_[i]:
                continue
            params = dict(PARAMS[i])
            if i == 2 and 11 <= step < 16:
                params["r"] = 1.3
            if fed[i] < len(p):
                end = min(fed[i] + 5, len(p))
                batch.append([i + 1, p[fed[i]:end], end == len(p), params])
                fed[i] = end
            elif step == 7 and i == 1:
                batch.append([i + 1, [(last[i] + 1) % 300], True, params])
            else:  # the token just sampled: Piped sends it as null
                batch.append([i + 1, [last[i]], True, params])
                prev.add(i + 1)
        toks, lps = via.step(batch, prev)
        k = 0
        for b in batch:
            if b[2]:
                last[b[0] - 1] = toks[k]
                out.append((step, b[0], toks[k], round(lps[k], 5)))
                k += 1
        if step == 9:
            via.free(1)
            open_[0] = False
    return out


def check(path):
    with torch.no_grad():
        want = run(model(path, False))
        m = model(path, True)
        got = run(m)
        piped = model(path, True)
        got_piped = run(piped, Piped)
    assert got == want, "%s: overlap on:\n%r\noff:\n%r" % (path, got, want)
    assert got_piped == want, "%s: null rows:\n%r\nexplicit:\n%r" % (path, got_piped, want)
    sp = m.stats()["speculated"]
    assert sp["chained"] > 0 and sp["beside"] > 0 and sp["discarded"] > 0, (path, sp)
    assert sp["launched"] >= sp["chained"] + sp["beside"], (path, sp)
    assert piped.stats()["speculated"] == sp, (path, piped.stats()["speculated"], sp)
    print("%s: speculated %s" % (path, sp))
    return 3


def cached_pool(path):
    """A pool whose free list is empty, every block either held or an idle
    block of the prefix cache (a server's pool once its cache has filled):
    a step whose sequence ends its prompt on a block's last token must
    still speculate the next step, its block taken from the cache's least
    recently used (never from a saved prefix). Greedy tokens as with the
    overlap off."""
    bs, blocks = 16, 24
    outs = []
    for overlap in (False, True):
        m = model(path, overlap, kv_capacity=bs * blocks, context_length=bs * blocks)
        if m.kv.layout.sliding_groups:
            return 0  # no prefix cache beside sliding windows: nothing fills the pool
        pool = m.kv.pool
        for seq in range(100, 100 + blocks):  # prompts of two full blocks, run and freed: their blocks stay cached
            p = [(seq * 53 + j * 29) % 300 + 5 for j in range(2 * bs)]
            m.open(seq, p, "")
            m.step([[seq, p, True, {}]])
            m.free(seq, "")
        p = [(j * 41 + 3) % 300 + 5 for j in range(3 * bs)]  # three full blocks: the next token needs a fourth
        m.open(1, p, "")
        # Fewer free blocks than the prompt takes: its step leaves the free
        # list empty, the pool's other blocks the cache's.
        assert len(pool.stack) < 3 and pool.held == 0, (len(pool.stack), len(pool.lru), pool.held)
        before = dict(m.speculated)
        out, t = [], m.step([[1, p, True, {}]]).tokens
        for _ in range(5):
            out += t
            t = m.step([[1, t, True, {}]]).tokens
        m.free(1, "")
        outs.append(out)
        if overlap:  # every step, the prompt's included, speculated the next
            assert m.speculated["launched"] - before["launched"] == 6, (before, m.speculated)
    assert outs[0] == outs[1], outs
    return 1


def last_rows(path):
    """A step's "last" sequences (their token is their last) are left out
    of the speculated next step: a lone prompt of one token launches
    nothing; of two decoding sequences where one ends, the other's next
    step is still the speculation's (used, not discarded), its tokens as
    with the overlap off; through the protocol's Worker too, which refuses
    a "last" that is not a list of sequence ids."""
    from mlxsworker.errors import ProtocolError
    p1 = [(j * 37 + 11) % 300 + 5 for j in range(9)]
    p2 = [(j * 53 + 7) % 300 + 5 for j in range(5)]
    outs = []
    for overlap in (False, True):
        m = model(path, overlap)
        out = []
        m.open(1, p1, "")
        before = dict(m.speculated)
        out += m.step([[1, p1, True, {}]], last=frozenset({1})).tokens
        if overlap:
            assert m.spec is None and m.speculated == before, (m.speculated, before)
        m.free(1, "")
        m.open(1, p1, "")
        m.open(2, p2, "")
        t = m.step([[1, p1, True, {}], [2, p2, True, {"l": True}]]).tokens
        out += t
        for step in range(3):  # sequence 2's third token here is its last
            t = m.step([[1, [t[0]], True, {}], [2, [t[1]], True, {"l": True}]],
                       last=frozenset({2}) if step == 2 else frozenset()).tokens
            out += t
        if overlap:
            assert m.spec is not None and list(m.spec.live.values()) == [0] and len(m.spec.rows) == 1, m.spec.live
            assert m.spec.fed() == [t[0]], (m.spec.fed(), t)
        m.free(2, "")
        before = dict(m.speculated)
        for _ in range(2):
            t = m.step([[1, [t[0]], True, {}]]).tokens
            out += t
        if overlap:
            assert m.speculated["discarded"] == before["discarded"], (before, m.speculated)
            assert m.speculated["chained"] + m.speculated["beside"] > before["chained"] + before["beside"], m.speculated
        m.free(1, "")
        outs.append(out)
    assert outs[0] == outs[1], outs
    m = model(path, True)
    w = Worker(None, None, None, False)
    w.models["m"] = m
    m.open(1, p1, "")
    before = dict(m.speculated)
    w.step({"id": 1, "model": "m", "batch": [[1, p1, True, {}]], "last": [1]})
    assert m.spec is None and m.speculated == before, (m.speculated, before)
    for i, bad in enumerate(({"1": 1}, [1.5], ["1"], [True], 7)):
        try:
            w.step({"id": 2 + i, "model": "m", "batch": [[1, [3], True, {}]], "last": bad})
            raise AssertionError("last %r accepted" % (bad,))
        except ProtocolError as e:
            assert "last" in str(e), e
    return 3


def main():
    graphs.record, graphs.new_pool = record, lambda: object()
    passed = sum(check(path) + cached_pool(path) + last_rows(path) for path in sys.argv[2:])
    print("%d passed, 0 failed" % passed)


main()

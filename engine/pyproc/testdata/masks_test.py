"""Randomised checks of the batched allowed-token masks (runtime/
sampling.py) and of how a device chain cuts constrained inputs at the
first token outside their loop (runtime/lookahead.py):

- every form of token set ("a", "d" with and without "v", "b"), with
  duplicate, unsorted and out-of-range ids and widths that are not a
  multiple of 8, decodes to the same tokens as a direct reading of the
  protocol, through the packed bitset (the GPU's path) and straight into
  bool rows (the CPU's);
- sample_rows with the batched masks samples what a per-row masked_fill
  samples (greedy and seeded temperature), with the same logprobs;
- _finish of a chain with loops keeps every input's tokens up to the first
  step at which some constrained input left its loop (lockstep), records
  the tokens fed accordingly, and takes back the dropped draws.

  python3 masks_test.py RUNTIME_DIR [ROUNDS] [SEED]

Prints "N passed, 0 failed" or raises. Run by TestMasksRandom.
"""
import base64
import random
import sys

sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402

from mlxsworker.torchrt import lookahead, sampling  # noqa: E402
from mlxsworker.torchrt.paged import Seq  # noqa: E402
from mlxsworker.torchrt.upload import HostCopy  # noqa: E402


def reference(x, width):
    """The set x names, read straight from PROTOCOL.md."""
    if "a" in x:
        return {i for i in x["a"] if 0 <= i < width}
    if "d" in x:
        v = min(int(x.get("v", width)), width)
        return set(range(v)) - set(x["d"])
    raw = base64.b64decode(x["b"])
    return {i for i in range(min(width, 8 * len(raw))) if raw[i >> 3] >> (i & 7) & 1}


def random_set(rng, width):
    form = rng.choice("adb")
    ids = [rng.randrange(-3, width + 20) for _ in range(rng.randrange(0, 3 * width // 4 + 1))]
    if form == "a":
        return {"a": ids + ids[:3]}
    if form == "d":
        x = {"d": ids}
        if rng.random() < 0.7:
            x["v"] = rng.randrange(1, width + 10)
        return x
    raw = bytes(rng.randrange(256) for _ in range(rng.randrange(0, (width + 7) // 8 + 3)))
    return {"b": base64.b64encode(raw).decode()}


def check_sets(rng):
    width = rng.randrange(1, 300)
    xs = [random_set(rng, width) if rng.random() < 0.8 else None for _ in range(rng.randrange(1, 6))]
    items = [({"x": x} if x is not None else {}, None) for x in xs]
    if all(x is None for x in xs):
        items.append(({"x": {"a": [0]}}, None))
        xs.append({"a": [0]})
    np = sampling._np
    for packed, numpy in ((True, True), (True, False), (False, True)):
        sampling._np = np if numpy else None  # without numpy: the shifts the GPU runs
        try:
            got = sampling.device_masks(items, width, "cpu", packed=packed)
        finally:
            sampling._np = np
        assert got.shape == (len(xs), width), got.shape
        for r, x in enumerate(xs):
            want = set(range(width)) if x is None else reference(x, width)
            have = set(got[r].nonzero().flatten().tolist())
            assert have == want, (packed, x, width, sorted(have ^ want)[:10])


def check_sampling(rng):
    width = rng.randrange(8, 200)
    rows = rng.randrange(1, 6)
    logits = torch.randn(rows, width, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
    items, items_ref, masks = [], [], []
    for r in range(rows):
        p = {"l": True}
        if rng.random() < 0.5:
            p.update({"t": 0.8, "s": rng.randrange(1 << 40)})
        allowed = set()
        if rng.random() < 0.8:
            allowed = {rng.randrange(width) for _ in range(rng.randrange(1, width))}
            p["x"] = {"a": sorted(allowed)}
        masks.append(allowed)
        items.append((p, Seq(0, [], [])))
        items_ref.append((p, Seq(0, [], [])))
    toks, lps, _ = sampling.sample_rows(logits, items, "cpu")
    # The per-row path this replaced: a masked_fill per row, then the same sampling.
    ref = logits.clone()
    for r, (p, _) in enumerate(items_ref):
        if "x" in p:
            m = torch.zeros(width, dtype=torch.bool)
            m[sorted(masks[r])] = True
            ref[r].masked_fill_(~m, float("-inf"))
    plain = [({k: v for k, v in p.items() if k != "x"}, s) for p, s in items_ref]
    want, wlps, _ = sampling.sample_rows(ref, plain, "cpu")
    assert toks == want, (toks, want)
    assert all(abs(a - b) < 1e-5 for a, b in zip(lps, wlps)), (lps, wlps)
    for r, t in enumerate(toks):
        assert not masks[r] or t in masks[r], (r, t)


def check_cut(rng):
    """A chain of `steps` steps over `rows` inputs, some with a loop."""
    width, rows, steps = 64, rng.randrange(1, 5), rng.randrange(1, 7)
    done = rng.randrange(2)
    toks = [[rng.randrange(width) for _ in range(rows)] for _ in range(steps)]
    feed = [rng.randrange(width) for _ in range(rows)]
    items, loops = [], []
    for r in range(rows):
        p = {"t": 0.5, "s": 7} if rng.random() < 0.5 else {}
        s = Seq(0, [], [])
        s.tokens = [1, 2, 3]
        if p:  # one remembered draw per step, as _sample does
            g = sampling._generator(s, p)
            s.hist = []
            for _ in range(steps):
                s.hist.append(g.get_state())
                g.next()
        bits = None
        if rng.random() < 0.7:
            loop = {t for t in range(width) if rng.random() < 0.8}
            p = dict(p, x={"d": []}, lp={"a": sorted(loop)}, ls=steps)
            bits = sampling.packed_set(p["lp"], width)
        items.append((p, s))
        loops.append(bits)
    ch = lookahead._Chain()
    ch.items, ch.feed, ch.done, ch.run, ch.steps = items, feed, done, [steps] * rows, steps
    ch.copy = HostCopy([torch.tensor(toks)])  # on the CPU: a plain copy
    ch.loops = loops if any(b is not None for b in loops) else None
    pos0 = [s.gen.pos if s.gen is not None else None for _, s in items]
    res, _ = lookahead._finish(ch)
    # The truth: the first step at which a constrained input leaves its loop.
    cut = steps
    for r in range(rows):
        if loops[r] is None:
            continue
        seq = ([feed[r]] if done else []) + [toks[j][r] for j in range(steps)]
        for q, t in enumerate(seq):
            if not lookahead.in_loop(loops[r], t):
                cut = min(cut, q + 1 - done)
                break
    for r, (p, s) in enumerate(items):
        want = [toks[j][r] for j in range(cut)]
        assert res[r] == want, (r, res[r], want, done)
        fed = [1, 2, 3] + ([feed[r]] + want[:-1] if want else [])
        assert s.tokens == fed, (s.tokens, fed)
        if s.gen is not None:
            assert s.gen.pos == pos0[r] - (steps - cut), (s.gen.pos, pos0[r], steps, cut)


def main():
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    n = 0
    for _ in range(rounds):
        check_sets(rng)
        check_sampling(rng)
        check_cut(rng)
        n += 3
    print("%d passed, 0 failed" % n)


main()

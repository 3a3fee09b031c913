"""sampling.draws, the torch backend's temperature draws for a step's rows
at once, on the CPU: its filter (temperature, top-k, top-p, min-p) gives
each row what filtering that row alone gives (the per-row code it
replaced, kept here as the reference); its inverse transform never picks
a token of probability 0 and picks the same tokens whatever order its
scan adds in (CUDA's add in tree order), picks each token for its share
of the uniforms, and gives a row with nothing left its largest entry; a seeded
row draws the same token alone and among other rows, and again after its
draw is taken back (Draws.set_state); a step's uniforms drawn at once
(uniforms) are each Draws' own, bit for bit.

  python3 draws_test.py RUNTIME_DIR

Prints "N passed, 0 failed" or raises. Run by TestBatchedDraws.
"""
import sys
import types

sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402

from mlxsworker.torchrt import sampling  # noqa: E402

passed = 0
g = torch.Generator().manual_seed(0)


def one_row(row, params):
    """A row filtered alone: temperature, top-k (ties kept), top-p, min-p."""
    row = row / float(params["t"])
    k = int(params.get("k") or 0)
    if 0 < k < row.shape[-1]:
        kth = torch.topk(row, k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    probs = torch.softmax(row, dim=-1)
    p = float(params.get("p") or 0)
    if 0 < p < 1:
        sp, si = torch.sort(probs, descending=True)
        drop = torch.cumsum(sp, dim=-1) - sp >= p
        probs = torch.zeros_like(probs).scatter(0, si, sp.masked_fill(drop, 0))
    m = float(params.get("m") or 0)
    if m > 0:
        probs = probs.masked_fill(probs < m * probs.max(), 0)
    return probs


# The filter against the rows one by one, parameters mixed in one batch.
V = 97
grid = [{"t": t, "k": k, "p": p, "m": m} for t in (0.5, 1.0, 1.7) for k in (0, 1, 5, V, V + 3)
        for p in (0, 0.3, 0.9, 1) for m in (0, 0.05, 0.5)]
x = torch.randn(len(grid), V, generator=g) * 3
x[:, 10] = x[:, 11]  # a tie, kept by top-k as one row alone keeps it
got = sampling.filtered(x, grid)
for i, params in enumerate(grid):
    want = one_row(x[i], params)
    assert torch.equal(got[i] > 0, want > 0), (params, got[i], want)
    assert torch.allclose(got[i], want, atol=1e-7, rtol=1e-6), (params, (got[i] - want).abs().max())
    passed += 1

# pick: a token of probability 0 never, whatever the uniform; each token
# for its share of a fine grid of uniforms.
probs = torch.rand(6, 50, generator=g)
probs[probs < 0.6] = 0  # most are 0
probs[:, 0] = 0
probs[:, -1] = 0  # the last entry is 0 too: u near 1 must stop before it
probs[5] = 0
probs[5, 17] = 1e-30  # a lone tiny probability
top = 1 - 2.0 ** -52
for u in (0.0, top, 0.5, 2.0 ** -52):
    tok = sampling.pick(probs, torch.full((6,), u, dtype=torch.float64))
    assert bool((probs.gather(1, tok.unsqueeze(1)) > 0).all()), (u, tok)
    passed += 1
n = 1 << 14
us = (torch.arange(n, dtype=torch.float64) + 0.5) / n
counts = torch.zeros(5, 50)
for u in us.split(1024):
    toks = sampling.pick(probs[:5].repeat_interleave(u.numel(), 0), u.repeat(5))
    counts.scatter_add_(1, toks.view(5, -1), torch.ones(5, u.numel()))
share = probs[:5] / probs[:5].sum(-1, keepdim=True)
assert torch.allclose(counts / n, share, atol=2.0 / n), (counts / n - share).abs().max()
passed += 1

# CUDA's scans add in tree order: pick's integer weights sum to the same
# cumulative weights in any order, so a blocked scan (each block summed,
# then the blocks' totals added) picks the same tokens.
real_cumsum = torch.cumsum


def blocked(x, dim, dtype=None):
    assert dim == -1 and x.dtype == torch.int64 and x.shape[-1] % 5 == 0
    b = real_cumsum(x.view(x.shape[0], -1, 5), dim=-1)
    return (b + real_cumsum(b[..., -1:], dim=1) - b[..., -1:]).view(x.shape)


for u in us.split(4096):
    P, U = probs[:5].repeat_interleave(u.numel(), 0), u.repeat(5)
    want = sampling.pick(P, U)
    sampling.torch.cumsum = blocked
    try:
        got = sampling.pick(P, U)
    finally:
        sampling.torch.cumsum = real_cumsum
    assert torch.equal(got, want)
passed += 1

# A row with nothing left (every token masked, or NaN logits) takes its
# largest entry, as greedy would, and the other rows draw as before.
x = torch.randn(3, 40, generator=g)
x[1] = float("-inf")
x[2, 5] = float("nan")
toks = sampling.draws(x, [0, 1, 2], [({"t": 1.0, "s": 1}, s) for s in (types.SimpleNamespace(gen=None) for _ in range(3))])
assert 0 <= int(toks[1]) < 40 and 0 <= int(toks[2]) < 40, toks
passed += 1
# Every row asking for top-p: the whole batch sorted at once.
x = torch.randn(4, 60, generator=g) * 2
ps = [{"t": 0.8, "p": 0.5}] * 4
got = sampling.filtered(x, ps)
for i in range(4):
    assert torch.allclose(got[i], one_row(x[i], ps[i]), atol=1e-7, rtol=1e-6)
passed += 1

# Draws: uniforms on the grid pick needs, a position each, taken back by
# set_state; a row draws the same alone and in a batch.
d = sampling.Draws(12345, 7)
us = [d.next() for _ in range(1000)]
assert all(0 <= u <= top for u in us) and d.pos == 1007 and len(set(us)) == 1000
d.set_state(7)
assert d.next() == us[0]
passed += 1

# uniforms (a step's draws in one pass over arrays where numpy is there)
# gives each Draws exactly its next(), edge seeds and positions included,
# and advances each by one.
rng = __import__("random").Random(5)
edges = [0, (1 << 64) - 1, (1 << 63), (1 << 64) - 1 - 0x2545F4914F6CDD1D]
for n in (1, 7, 8, 9, 64, 220):
    for _ in range(20):
        sp = [(rng.choice(edges + [rng.getrandbits(64), rng.getrandbits(8)]),
               rng.choice(edges + [rng.getrandbits(20), rng.getrandbits(64)])) for _ in range(n)]
        scalar, batched = [sampling.Draws(*x) for x in sp], [sampling.Draws(*x) for x in sp]
        want = [d.next() for d in scalar]
        got = sampling.uniforms(batched)
        assert got.dtype == torch.float64 and got.tolist() == want, (n, sp)
        assert [d.pos for d in batched] == [d.pos for d in scalar]
passed += 1


def seqs(n):
    return [types.SimpleNamespace(gen=None) for _ in range(n)]


logits = torch.randn(8, 1000, generator=g)
params = [{"t": 0.8, "s": 40 + i, "k": 50 * (i % 3), "p": 0.9 if i % 2 else 0} for i in range(8)]
together = sampling.draws(logits, list(range(8)), list(zip(params, seqs(8))))
for i in range(8):
    alone = sampling.draws(logits[i:i + 1], [0], [(params[i], types.SimpleNamespace(gen=None))])
    assert int(alone[0]) == int(together[i]), (i, alone, together)
    passed += 1
# Unseeded rows still draw (a seed of their own), and a step's draws
# move each row's position by one.
items = [({"t": 1.0}, s) for s in seqs(3)]
toks = sampling.draws(logits[:3], [0, 1, 2], items)
assert toks.shape == (3,) and all(s.gen.pos == 1 for _, s in items)
passed += 1
print("%d passed, 0 failed" % passed)

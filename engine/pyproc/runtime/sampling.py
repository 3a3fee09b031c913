"""Sampling on the device: greedy, temperature, top-k, top-p, min-p,
repetition, presence and frequency penalties, logit bias, allowed-token
masks, top log-probabilities, per-sequence seeded generators.

Parameters arrive as the protocol's compact dict: t temperature, k top-k,
p top-p, m min-p, r repetition penalty, s seed (absent: unseeded), l logprob,
n top log-probabilities, pp presence and fp frequency penalty, lb logit
bias ([[id, bias], ...]), x this step's allowed-token mask ({"a": ids},
{"d": ids} or {"b": base64 bitset}), g how many of the prompt's last
tokens were generated before the sequence was resumed.
"""
import base64
import random

import torch

try:
    import numpy as _np
except ImportError:  # torch runs without numpy; the bitset path then uses torch ops
    _np = None


_MASK64 = (1 << 64) - 1


def _mix64(x):
    """splitmix64's finaliser: a cheap bijective scramble of 64 bits."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class Draws:
    """A sequence's temperature draws: each draw's generator is seeded from
    the sequence's seed and the draw's generated position, so a sequence
    resumed with "g" generated tokens draws as the uninterrupted one did
    from that position on. get_state and set_state save and restore the
    position (lookahead takes draws back with them)."""

    __slots__ = ("seed", "pos", "gen")

    def __init__(self, seed, pos, device):
        self.seed, self.pos = seed, pos
        self.gen = torch.Generator(device=device)

    def next(self):
        """The generator for the draw at the current position; advances it."""
        self.gen.manual_seed(_mix64(self.seed ^ _mix64(self.pos + 0x2545F4914F6CDD1D)) & ((1 << 63) - 1))
        self.pos += 1
        return self.gen

    def get_state(self):
        return self.pos

    def set_state(self, pos):
        self.pos = pos


def _generator(seq, params, device):
    """The sequence's Draws, made at its first temperature draw from the
    seed ("s", a random one when absent) and the generated position it
    starts at ("g")."""
    if seq.gen is None:
        seed = params.get("s")
        seed = int(seed) & _MASK64 if seed is not None else random.getrandbits(64)
        seq.gen = Draws(seed, int(params.get("g") or 0), device)
    return seq.gen


def draw(seq, params, probs, device):
    """One temperature draw from probs for seq."""
    return torch.multinomial(probs, 1, generator=_generator(seq, params, device).next())[0]


def note_fed(seq, toks):
    """Counts the tokens fed after the sequence's first sample: the
    generated ones, for presence and frequency penalties."""
    if getattr(seq, "sampled", False):
        counts = seq.counts
        for t in toks:
            counts[t] = counts.get(t, 0) + 1


def note_forced(seq, toks, sample):
    """Jump-forward decoding (the "jump_forward" capability): a sampling
    input of a sequence that has sampled holds the token it sampled last,
    then tokens the caller appended without sampling. Each of those is a
    generated position, so the draw after them is the one a sequence that
    had sampled them takes. (note_fed counts them for the penalties.)"""
    if sample and len(toks) > 1 and getattr(seq, "sampled", False) and seq.gen is not None:
        seq.gen.pos += len(toks) - 1


def _resume(seq, params):
    """At a sequence's first sample: the prompt's last "g" tokens were
    generated before it was resumed, so presence and frequency penalties
    count them."""
    g = min(int(params.get("g") or 0), len(seq.tokens))
    if g > 0 and (params.get("pp") or params.get("fp")):
        counts = seq.counts
        for t in seq.tokens[len(seq.tokens) - g:]:
            counts[t] = counts.get(t, 0) + 1


def _penalise(row, seq, r):
    if not seq.tokens:
        return row
    idx = torch.tensor(sorted(set(seq.tokens)), device=row.device)
    vals = row[idx]
    row = row.clone()
    row[idx] = torch.where(vals > 0, vals / r, vals * r)
    return row


def allowed_mask(x, width, device):
    """Decodes the protocol's mask into a bool tensor of width entries;
    ids past the mask are disallowed."""
    if "a" in x:
        m = torch.zeros(width, dtype=torch.bool)
        ids = [i for i in x["a"] if 0 <= i < width]
        if ids:
            m[torch.tensor(ids)] = True
    elif "d" in x:
        m = torch.ones(width, dtype=torch.bool)
        ids = [i for i in x["d"] if 0 <= i < width]
        if ids:
            m[torch.tensor(ids)] = False
        if "v" in x and x["v"] < width:
            m[int(x["v"]):] = False
    else:
        m = torch.zeros(width, dtype=torch.bool)
        bits = _unpack(base64.b64decode(x["b"]))
        n = min(width, bits.shape[0])
        m[:n] = bits[:n]
    return m.to(device)


def _unpack(raw):
    """Bits of raw, least significant first, as a bool tensor."""
    if _np is not None:
        return torch.from_numpy(_np.unpackbits(_np.frombuffer(raw, dtype=_np.uint8), bitorder="little").view(_np.bool_))
    b = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return ((b.unsqueeze(1) >> torch.arange(8, dtype=torch.uint8)) & 1).flatten().bool()


def _adjust(row, seq, params):
    """Penalties, logit bias and the allowed mask, in the engine's order."""
    pp, fp = float(params.get("pp") or 0), float(params.get("fp") or 0)
    counts = getattr(seq, "counts", None)
    if (pp or fp) and counts:
        ids = list(counts)
        idx = torch.tensor(ids, device=row.device)
        n = torch.tensor([counts[i] for i in ids], device=row.device, dtype=row.dtype)
        row[idx] -= pp + fp * n
    lb = params.get("lb")
    if lb:
        idx = torch.tensor([int(i) for i, _ in lb], device=row.device)
        row[idx] += torch.tensor([float(b) for _, b in lb], device=row.device, dtype=row.dtype)
    x = params.get("x")
    if x:
        row.masked_fill_(~allowed_mask(x, row.shape[-1], row.device), float("-inf"))
    return row


def _filter(row, params):
    """Temperature, then top-k, top-p and min-p masks; returns probs."""
    row = row / float(params["t"])
    k = int(params.get("k") or 0)
    if 0 < k < row.shape[-1]:
        kth = torch.topk(row, k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    probs = torch.softmax(row, dim=-1)
    p = float(params.get("p") or 0)
    if 0 < p < 1:
        sp, si = torch.sort(probs, descending=True)
        cum = torch.cumsum(sp, dim=-1)
        drop = cum - sp >= p  # keep the smallest prefix reaching p
        sp = sp.masked_fill(drop, 0)
        probs = torch.zeros_like(probs).scatter(0, si, sp)
    m = float(params.get("m") or 0)
    if m > 0:
        probs = probs.masked_fill(probs < m * probs.max(), 0)
    return probs


def sample_rows(logits, items, device):
    """logits [S, vocab] float32; items: (params, seq) per row. Returns the
    sampled token ids, their logprobs (0.0 where not asked) and the top
    log-probabilities ([] where not asked) as [[id, logprob], ...]."""
    S = logits.shape[0]
    if S == 0:
        return [], [], []
    for params, seq in items:
        if not seq.sampled:
            _resume(seq, params)
    pen = [(i, float(p.get("r") or 0), s) for i, (p, s) in enumerate(items)]
    pen = [(i, r, s) for i, r, s in pen if r > 0 and r != 1]
    adj = [i for i, (p, _) in enumerate(items) if p.get("x") or p.get("lb") or p.get("pp") or p.get("fp")]
    if pen or adj:
        logits = logits.clone()
        for i, r, s in pen:
            logits[i] = _penalise(logits[i], s, r)
        for i in adj:
            params, seq = items[i]
            logits[i] = _adjust(logits[i], seq, params)
    out = torch.argmax(logits, dim=-1)
    for i, (params, seq) in enumerate(items):
        if float(params.get("t") or 0) > 0:
            probs = _filter(logits[i], params)
            out[i] = draw(seq, params, probs, device)
        seq.sampled = True
    want = [i for i, (params, _) in enumerate(items) if params.get("l") or params.get("n")]
    lps, tops = [0.0] * S, [[] for _ in range(S)]
    if want:
        w = torch.tensor(want, device=logits.device)
        ls = torch.log_softmax(logits[w], dim=-1)
        lp = ls.gather(1, out[w].unsqueeze(1)).squeeze(1).tolist()
        for k, (i, v) in enumerate(zip(want, lp)):
            lps[i] = v
            n = int(items[i][0].get("n") or 0)
            if n > 0:
                vals, ids = torch.topk(ls[k], min(n, ls.shape[-1]))
                tops[i] = [[int(a), float(b)] for a, b in zip(ids.tolist(), vals.tolist()) if b != float("-inf")]
    return out.tolist(), lps, tops

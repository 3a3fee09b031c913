"""Sampling on the device: greedy, temperature, top-k, top-p, min-p,
repetition penalty, per-sequence seeded generators.

Parameters arrive as the protocol's compact dict: t temperature, k top-k,
p top-p, m min-p, r repetition penalty, s seed (absent: unseeded), l logprob.
"""
import random

import torch


def _generator(seq, params, device):
    if seq.gen is None:
        g = torch.Generator(device=device)
        seed = params.get("s")
        g.manual_seed(int(seed) & ((1 << 63) - 1) if seed is not None else random.getrandbits(63))
        seq.gen = g
    return seq.gen


def _penalise(row, seq, r):
    if not seq.tokens:
        return row
    idx = torch.tensor(sorted(set(seq.tokens)), device=row.device)
    vals = row[idx]
    row = row.clone()
    row[idx] = torch.where(vals > 0, vals / r, vals * r)
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
    sampled token ids and their logprobs (0.0 where not asked)."""
    S = logits.shape[0]
    if S == 0:
        return [], []
    pen = [(i, float(p.get("r") or 0), s) for i, (p, s) in enumerate(items)]
    pen = [(i, r, s) for i, r, s in pen if r > 0 and r != 1]
    if pen:
        logits = logits.clone()
        for i, r, s in pen:
            logits[i] = _penalise(logits[i], s, r)
    out = torch.argmax(logits, dim=-1)
    for i, (params, seq) in enumerate(items):
        if float(params.get("t") or 0) > 0:
            probs = _filter(logits[i], params)
            out[i] = torch.multinomial(probs, 1, generator=_generator(seq, params, device))[0]
    want = [i for i, (params, _) in enumerate(items) if params.get("l")]
    lps = [0.0] * S
    if want:
        w = torch.tensor(want, device=logits.device)
        lp = torch.log_softmax(logits[w], dim=-1).gather(1, out[w].unsqueeze(1)).squeeze(1).tolist()
        for i, v in zip(want, lp):
            lps[i] = v
    return out.tolist(), lps

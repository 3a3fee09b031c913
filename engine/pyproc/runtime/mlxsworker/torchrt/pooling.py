"""Pooling of a sequence's last hidden state (after the final norm) into
one vector (PROTOCOL.md, Embeddings): the decoders' pooled sequences
(torch_backend.py) fed in chunks, and the encoders' (encserve.py) fed
whole.

A decoder's pooled sequence keeps what its chunks contribute as they
run: the float32 sum of its rows (mean), its first row (cls), and its
last row once its input ends (lasttoken)."""
import base64

import torch

from ..backend import StepResult
from ..errors import INVALID, ProtocolError

POOLS = ("mean", "cls", "lasttoken")


def check_mode(mode):
    """Refuses a pooling mode not in POOLS (invalid_value)."""
    if mode not in POOLS:
        raise ProtocolError(INVALID, "pooling %r (want one of %s)" % (mode, ", ".join(POOLS)))


class Pooled:
    """A pooled sequence's running state: its mode, the float32 sum of its
    rows so far, its first row and the vector once its input ended."""
    __slots__ = ("mode", "sum", "first", "vec")

    def __init__(self, mode):
        check_mode(mode)
        self.mode, self.sum, self.first, self.vec = mode, None, None, None

    def rows(self, p, n, last):
        """Which of a chunk's n rows (at positions p..) the mode reads:
        (start, count) within the chunk; last: the chunk ends the input."""
        if self.mode == "mean":
            return 0, n
        if self.mode == "cls":
            return (0, 1) if p == 0 else (0, 0)
        return (n - 1, 1) if last else (0, 0)

    def add(self, h, p, last, fed):
        """Takes a chunk's rows h (those rows() named, in the model's
        dtype) at position p; fed: the tokens fed with it, all told. Sets
        vec when last."""
        if self.mode == "mean" and h.shape[0]:
            s = h.float().sum(0)
            self.sum = s if self.sum is None else self.sum + s
        elif self.mode == "cls" and p == 0:
            self.first = h[0].float()
        if last:
            self.vec = finish(self.mode, self.sum, self.first, h[-1].float() if h.shape[0] else None, fed)


def with_pooled(batch, seqs, out):
    """The StepResult of a step whose generating inputs' result is out,
    with the pooled sampling inputs put in their places (token -1, no
    log-probability, no tokens ahead) and the embeddings per sampling
    input (None for a generating one; the list None when no pooled input
    ended)."""
    res = StepResult([], [], [], None if out.more is None else [], None if out.more_logprobs is None else [])
    gen = iter(range(len(out.tokens)))
    emb = []
    for b, s in zip(batch, seqs):
        if not b[2]:
            continue
        if s.pool is None:
            i = next(gen)
            row = (out.tokens[i], out.logprobs[i], out.top[i], out.more and out.more[i], out.more_logprobs and out.more_logprobs[i])
            emb.append(None)
        else:
            row = (-1, 0.0, [], [], [])
            emb.append(s.pool.vec)
        for col, v in zip((res.tokens, res.logprobs, res.top, res.more, res.more_logprobs), row):
            if col is not None:
                col.append(v)
    vecs = [v for v in emb if v is not None]
    if vecs:
        host = iter(torch.stack(vecs).cpu().unbind(0))  # one copy, one wait for the device
        res.embeddings = [None if v is None else encode(next(host)) for v in emb]
    return res


def finish(mode, total, first, last, n):
    """The vector of mode from the float32 sum of n rows, the first row
    and the last."""
    if mode == "mean":
        return total / n
    if mode == "cls":
        return first
    return last


def encode(vec):
    """A float32 vector as the protocol carries it: base64 of its
    little-endian bytes."""
    return base64.b64encode(vec.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4").tobytes()).decode()

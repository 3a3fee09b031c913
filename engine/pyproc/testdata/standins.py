"""Plain-torch stand-ins for what the CUDA paths of the runtime need, so
that the CPU tests (prefill_graphs_test.py, overlap_test.py) run those
paths: a captured graph kept as a callable that every replay runs again,
the Triton kernels' entry points (kernels.py, and moe_triton.py's as
MoEKern; prompt_attention as prefill.attention_reference, the kernel's
check at load) and the varlen flash call, in float32. Attention sinks (gpt_oss) take the real calls' interfaces and
math: decode_attention adds exp(s_h - m) to its softmax's denominator, as
the kernel does; flash_varlen returns its log-sum-exp for the decoder to
rescale by.
"""
import torch
import torch.nn.functional as F
from mlxsworker.torchrt import prefill


def prompt(mul, add, n):
    """n token ids of the tiny test models' vocabulary, in a pattern of
    their own for each (mul, add)."""
    return [(j * mul + add) % 300 + 5 for j in range(n)]


def sampler(m, out):
    """A step function for the TorchModel m: runs a batch, adds its
    (token, logprob) pairs to out and returns its tokens."""
    def step(batch):
        r = m.step(batch)
        out.extend(zip(r.tokens, r.logprobs))
        return r.tokens
    return step


class Replay:
    """A captured step: replay runs it again, into the output buffer
    when the step returns one."""

    def __init__(self, fn, out):
        self.fn, self.out = fn, out

    def replay(self):
        y = self.fn()
        if self.out is not None:
            self.out.copy_(y)


def record(step, pool, warmup=2):
    """graphs.record without CUDA: the step runs once (the warm-up) and
    is kept."""
    out = step()
    return Replay(step, out), out


class Kern:
    """kernels.py's entry points in plain torch (float32) for the decoder
    m; the pool written and read through m's KV format (kvcache.py), as
    the kernels convert FP8 in registers."""

    def __init__(self, m):
        self.m = m

    def argmax(self, x):
        return torch.argmax(x, dim=-1)

    def add_rms(self, x, d, w, eps, norm="llama"):
        if d is not None and d.dim() == 3:  # a mixture's k choices, unsummed
            d = d.sum(dim=1)
        x = x if d is None else x + d
        return x, self.m.rms(x, w)

    def silu_mul(self, gu):
        g, u = gu.chunk(2, dim=-1)
        return F.silu(g) * u

    def _rot(self, qkv, pos, cos, sin, heads, kv_heads):
        hd = self.m.cfg.head_dim
        x = qkv[:, : (heads + kv_heads) * hd].reshape(-1, heads + kv_heads, hd)
        return self.m.rope(x, cos[pos].unsqueeze(1), sin[pos].unsqueeze(1))

    def rope_kv(self, qkv, kc, vc, kvrow, pos, cos, sin, heads, kv_heads, rot=None, k_scale=1.0, v_scale=1.0):
        hd, f = kc.shape[-1], self.m.kvq
        qk = self._rot(qkv, pos, cos, sin, heads, kv_heads)
        f.store(kc.view(-1, kv_heads, hd), kvrow, qk[:, heads:], k_scale)
        f.store(vc.view(-1, kv_heads, hd), kvrow, qkv[:, (heads + kv_heads) * hd :].reshape(-1, kv_heads, hd), v_scale)
        return qk

    def prompt_attention(self, q, kc, vc, table, tiles, ntiles, out, heads, kv_heads, tb, scale=None, window=0,
                         k_scale=1.0, v_scale=1.0):
        assert int(tiles[1, :ntiles].max()) <= tb, "a tile of more tokens than the kernel's"
        return prefill.attention_reference(q, kc, vc, table, tiles, ntiles, out, heads, kv_heads, scale, window, k_scale,
                                           v_scale, self.m.kvq)

    def decode_attention(self, qkv, kc, vc, table, rows, pos, cos, sin, heads, kv_heads, context, scale=None, window=0,
                         rot=None, prefetch=True, k_scale=1.0, v_scale=1.0, sinks=None, qk_norm=None, early=False):
        bs, hd, f = kc.shape[1], kc.shape[-1], self.m.kvq
        if qk_norm is not None:  # each head of q and k normalised first
            qkv = self.m.qk_norm(qkv, {"q_norm": qk_norm[0], "k_norm": qk_norm[1]})
        qk = self._rot(qkv, pos, cos, sin, heads, kv_heads)
        v = qkv[:, (heads + kv_heads) * hd :].reshape(-1, kv_heads, hd)
        out = []
        for b in range(qkv.shape[0]):
            p, row = int(pos[b]), int(rows[b])
            at = int(table[row, p // bs]) * bs + p % bs
            f.store(kc.view(-1, kv_heads, hd), at, qk[b, heads:], k_scale)
            f.store(vc.view(-1, kv_heads, hd), at, v[b], v_scale)
            blocks = table[row, : p // bs + 1].long()
            kk = f.load(kc, blocks, k_scale).reshape(-1, kv_heads, hd)[: p + 1]
            vv = f.load(vc, blocks, v_scale).reshape(-1, kv_heads, hd)[: p + 1]
            s, vh = _scores(qk[b, :heads].unsqueeze(0), kk, vv, scale, window)
            out.append((_decode_softmax(s, sinks) @ vh).reshape(-1))
        return torch.stack(out)


def _decode_softmax(s, sinks):
    """The decode kernel's softmax of scores s [H, 1, L]: exp(s - m) over
    the row's sum, plus exp(sink - m) per head where sinks [H] are given."""
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    den = e.sum(-1, keepdim=True)
    if sinks is not None:
        den = den + torch.exp(sinks.view(-1, 1, 1) - m)
    return e / den


def _scores(q, k, v, scale, window=0):
    """(scaled scores [H, T, L] of q [T, H, hd] over k [L, K, hd], causal
    aligned bottom-right, -inf where masked; v as [H, L, hd]); a window w
    > 0 keeps the keys j of query i with i - w < j <= i."""
    T, H, hd = q.shape
    L, K = k.shape[0], k.shape[1]
    k, v = (t.repeat_interleave(H // K, dim=1) for t in (k, v))
    s = torch.einsum("thd,lhd->htl", q, k) * (scale if scale is not None else hd ** -0.5)
    kp, qp = torch.arange(L).unsqueeze(0), torch.arange(L - T, L).unsqueeze(1)
    allowed = kp <= qp
    if window:
        allowed = allowed & (kp > qp - window)
    return s.masked_fill(~allowed, float("-inf")), v.transpose(0, 1)


def _attend(q, k, v, scale, window=0):
    """(output [T, H, hd], log-sum-exp [T, H]) of q over k and v as
    _scores masks them; a query that sees no key gets zeros (and -inf),
    as flash gives it zeros."""
    s, v = _scores(q, k, v, scale, window)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return (p @ v).transpose(0, 1), torch.logsumexp(s, dim=-1).transpose(0, 1)


def flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale=None, window=0, lse=False):
    """decoder._flash_varlen: the output, and with lse each query's
    log-sum-exp [Tq, H]."""
    out, lses = [], []
    for i in range(len(cu_q) - 1):
        qa, qb, ka, kb = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        o, L = _attend(q[qa:qb], k[ka:kb], v[ka:kb], scale, window)
        out.append(o)
        lses.append(L)
    return (torch.cat(out), torch.cat(lses)) if lse else torch.cat(out)


class MoEKern:
    """moe_triton's entry points in plain torch: the routing as moe.Experts
    routes, the sort by expert as moe.align sorts, and the blocks as the
    two kernels run them (each block's rows gathered, its expert's
    gate_up, silu * up, down, times the routing weight, written at the
    pair's row)."""

    @staticmethod
    def route(logits, k, renorm):
        p = torch.softmax(logits, dim=-1, dtype=torch.float32)
        w, idx = torch.topk(p, k, dim=-1)
        return (w / w.sum(dim=-1, keepdim=True) if renorm else w), idx

    @staticmethod
    def align(flat, experts, BM, nb):
        from mlxsworker.torchrt import moe
        rows, bexp = moe.align(flat, experts, BM)
        assert bexp.numel() == nb
        return rows, bexp

    @staticmethod
    def experts(h, gu_w, down_w, rows, bexp, weights, k, tiles):
        P, BM, E = h.shape[0] * k, tiles[0], gu_w.shape[0]
        ys = torch.zeros(P, h.shape[1], dtype=h.dtype)
        for b in range(bexp.numel()):
            e = int(bexp[b])
            if e >= E:
                continue
            r = rows[b * BM:(b + 1) * BM].long()
            pairs = r[r < P]
            g, u = F.linear(h[pairs // k], gu_w[e]).chunk(2, dim=-1)
            ys[pairs] = F.linear(F.silu(g) * u, down_w[e]) * weights[pairs].unsqueeze(1)
        return ys

"""Plain-torch stand-ins for what the CUDA paths of the runtime need, so
that the CPU tests (prefill_graphs_test.py, overlap_test.py) run those
paths: a captured graph kept as a callable that every replay runs again,
the Triton kernels' entry points (kernels.py) and the varlen flash call,
in float32.
"""
import torch
import torch.nn.functional as F


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

    def decode_attention(self, qkv, kc, vc, table, rows, pos, cos, sin, heads, kv_heads, context, scale=None, window=0,
                         rot=None, prefetch=True, k_scale=1.0, v_scale=1.0):
        bs, hd, f = kc.shape[1], kc.shape[-1], self.m.kvq
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
            out.append(_attend(qk[b, :heads].unsqueeze(0), kk, vv, scale, window).reshape(-1))
        return torch.stack(out)


def _attend(q, k, v, scale, window=0):
    """q [T, H, hd] over k, v [L, K, hd], causal aligned bottom-right; a
    window w > 0 keeps the keys j of query i with i - w < j <= i."""
    T, H, hd = q.shape
    L, K = k.shape[0], k.shape[1]
    k, v = (t.repeat_interleave(H // K, dim=1) for t in (k, v))
    s = torch.einsum("thd,lhd->htl", q, k) * (scale if scale is not None else hd ** -0.5)
    kp, qp = torch.arange(L).unsqueeze(0), torch.arange(L - T, L).unsqueeze(1)
    allowed = kp <= qp
    if window:
        allowed = allowed & (kp > qp - window)
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.einsum("htl,lhd->thd", torch.softmax(s, dim=-1), v)


def flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale=None, window=0):
    out = []
    for i in range(len(cu_q) - 1):
        qa, qb, ka, kb = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        out.append(_attend(q[qa:qb], k[ka:kb], v[ka:kb], scale, window))
    return torch.cat(out)

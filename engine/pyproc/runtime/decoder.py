"""A compact Llama-family transformer in plain torch.

Covers Llama 2/3 (llama3 rope scaling), Mistral, Qwen2 (q/k/v biases) and
Qwen3 (per-head q/k RMSNorm before the rotary embedding):
RMSNorm, rotary embeddings, grouped-query attention, SwiGLU MLP, tied
embeddings. Tokens of a step are packed into one [N, hidden] matrix for the
projections and the MLP; attention runs per group: all one-token sequences
together, each multi-token chunk on its own, reading KV through block
tables (paged.py).
"""
import json
import logging
import math
import os

import torch
import torch.nn.functional as F

try:  # torch 2.3+: causal masks aligned to the end of the keys, run by the flash kernels
    from torch.nn.attention.bias import causal_lower_right
except ImportError:
    causal_lower_right = None

from st import Checkpoint, CheckpointError
from stcheck import read_json

ARCHS = {"llama", "mistral", "qwen2", "qwen3"}
log = logging.getLogger("llama")

# Upper bounds far above any real model, so a crafted config.json cannot ask
# for absurd KV memory before the weights' shapes are compared with it.
LIMITS = {"hidden": 1 << 17, "layers": 1 << 10, "heads": 1 << 10, "kv_heads": 1 << 10, "head_dim": 1 << 17,
          "intermediate": 1 << 19, "vocab": 1 << 22, "context": 1 << 24}


class Config:
    """The fields of config.json the forward pass needs."""

    def __init__(self, directory):
        c = read_json(os.path.join(directory, "config.json"), "config.json")
        arch = c.get("model_type", "")
        if arch not in ARCHS:
            raise CheckpointError("config.json", "unsupported architecture %r (want one of %s)" % (arch, ", ".join(sorted(ARCHS))))
        try:
            self.arch = arch
            self.hidden = int(c["hidden_size"])
            self.layers = int(c["num_hidden_layers"])
            self.heads = int(c["num_attention_heads"])
            self.kv_heads = int(c.get("num_key_value_heads") or self.heads)
            self.head_dim = int(c.get("head_dim") or self.hidden // self.heads)
            self.intermediate = int(c["intermediate_size"])
            self.vocab = int(c["vocab_size"])
            self.context = int(c.get("max_position_embeddings") or 2048)
            self.eps = float(c.get("rms_norm_eps") or 1e-5)
            self.theta = float(c.get("rope_theta") or 10000.0)
            self.rope_scaling = c.get("rope_scaling")
            if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
                raise ValueError("rope_scaling is not an object")
            self.tie = bool(c.get("tie_word_embeddings", False))
            self.bias = arch == "qwen2" or bool(c.get("attention_bias", False))
            self.dtype = c.get("torch_dtype") or "float32"
            self.qk_norm = arch == "qwen3"
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError("config.json", "missing or bad field: %s" % e)
        if min(self.hidden, self.layers, self.heads, self.kv_heads, self.intermediate, self.vocab, self.head_dim, self.context) <= 0 or self.heads % self.kv_heads:
            raise CheckpointError("config.json", "inconsistent sizes")
        for field, limit in LIMITS.items():
            if getattr(self, field) > limit:
                raise CheckpointError("config.json", "%s %d is beyond any supported model (limit %d)" % (field, getattr(self, field), limit))
        self.bos, self.eos = _special_ids(directory, c)


def _special_ids(directory, c):
    bos, eos, src = c.get("bos_token_id"), c.get("eos_token_id"), "config.json"
    path = os.path.join(directory, "generation_config.json")
    if os.path.exists(path):
        g = read_json(path, "generation_config.json")
        bos = g.get("bos_token_id", bos)
        if "eos_token_id" in g:
            eos, src = g["eos_token_id"], "generation_config.json"
    if _is_id(eos):
        eos = [eos]
    if eos is not None and not (isinstance(eos, list) and all(_is_id(e) for e in eos)):
        raise CheckpointError(src, "eos_token_id: want an integer or a list of integers")
    return (bos if _is_id(bos) else -1), list(eos or [])


def _is_id(v):
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < (1 << 31)


def rope_inv_freq(cfg):
    dim = cfg.head_dim
    inv = 1.0 / (cfg.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    rs = cfg.rope_scaling
    if not rs:
        return inv
    kind = rs.get("rope_type") or rs.get("type")
    if kind == "default":
        return inv
    try:
        if kind == "linear":
            factor = float(rs["factor"])
            if not factor > 0:
                raise ValueError("factor must be positive")
            return inv / factor
        if kind != "llama3":
            raise CheckpointError("config.json", "unsupported rope_scaling %r" % (kind,))
        factor, low, high = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old = float(rs["original_max_position_embeddings"])
        if not (factor > 0 and low > 0 and high > low and old > 0):
            raise ValueError("bad parameters")
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError("config.json", "rope_scaling %s: %s" % (kind, e))
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(medium, smoothed, scaled)


class Llama:
    """Weights and the forward pass. The KV cache is owned by the caller
    (paged.PagedKV): kc[l] and vc[l] are [blocks, block_size, kv_heads,
    head_dim], read through the block table."""

    def __init__(self, directory, cfg, device, dtype):
        self.cfg, self.device, self.dtype = cfg, device, dtype
        ck = Checkpoint(directory)
        h, hd = cfg.hidden, cfg.head_dim
        get = lambda n, s: ck.get(n, s, device, dtype)
        self.embed = get("model.embed_tokens.weight", (cfg.vocab, h))
        self.layers = []
        for i in range(cfg.layers):
            p = "model.layers.%d." % i
            L = {
                "ln1": get(p + "input_layernorm.weight", (h,)),
                "ln2": get(p + "post_attention_layernorm.weight", (h,)),
                "o": get(p + "self_attn.o_proj.weight", (h, cfg.heads * hd)),
                "down": get(p + "mlp.down_proj.weight", (h, cfg.intermediate)),
            }
            q = get(p + "self_attn.q_proj.weight", (cfg.heads * hd, h))
            k = get(p + "self_attn.k_proj.weight", (cfg.kv_heads * hd, h))
            v = get(p + "self_attn.v_proj.weight", (cfg.kv_heads * hd, h))
            L["qkv"] = torch.cat([q, k, v])
            if cfg.qk_norm:  # Qwen3: an RMSNorm over each head of q and k, before the rotary embedding
                L["q_norm"] = get(p + "self_attn.q_norm.weight", (hd,))
                L["k_norm"] = get(p + "self_attn.k_norm.weight", (hd,))
            if cfg.bias:
                L["qkv_b"] = torch.cat([
                    get(p + "self_attn.q_proj.bias", (cfg.heads * hd,)),
                    get(p + "self_attn.k_proj.bias", (cfg.kv_heads * hd,)),
                    get(p + "self_attn.v_proj.bias", (cfg.kv_heads * hd,)),
                ])
            gate = get(p + "mlp.gate_proj.weight", (cfg.intermediate, h))
            up = get(p + "mlp.up_proj.weight", (cfg.intermediate, h))
            L["gate_up"] = torch.cat([gate, up])
            self.layers.append(L)
        self.norm = get("model.norm.weight", (h,))
        if cfg.tie or not ck.has("lm_head.weight"):
            self.lm_head = self.embed
        else:
            self.lm_head = get("lm_head.weight", (cfg.vocab, h))
        inv = rope_inv_freq(cfg)
        t = torch.arange(cfg.context, dtype=torch.float32)
        freqs = torch.outer(t, inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = emb.cos().to(device=device, dtype=dtype)
        self.sin = emb.sin().to(device=device, dtype=dtype)
        fast = device.type == "cuda"
        self.sdpa = fast and _sdpa_gqa()
        if self.sdpa and hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
            # cuDNN's attention builds an execution plan for every new query
            # length (about 100 ms each); prompt chunks come in every length,
            # so a server met a new one almost every step. The flash kernel
            # needs no plan.
            torch.backends.cuda.enable_cudnn_sdp(False)
        self.fused_rms = fast and hasattr(F, "rms_norm")
        self.kern = _kernels(cfg, device, dtype) if fast else None
        # Every prompt chunk of a step in one flash call per layer (varlen,
        # each chunk over its prefix and itself), instead of a handful of
        # calls and copies per chunk: steps under load carry several
        # chunks and were bound by launching them.
        self.varlen = self.sdpa and _varlen_ok(device, dtype, cfg.heads, cfg.kv_heads, cfg.head_dim)

    def rms(self, x, w):
        if self.fused_rms:
            return F.rms_norm(x, (x.shape[-1],), w, self.cfg.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.eps)
        return w * xf.to(x.dtype)

    def qk_norm(self, qkv, L):
        """qkv with each head of q and k RMS-normalised (the layer's
        q_norm and k_norm), when the family has them; the kernels then
        rotate and cache the normalised rows."""
        if "q_norm" not in L:
            return qkv
        H, K, hd = self.cfg.heads, self.cfg.kv_heads, self.cfg.head_dim
        q = self.rms(qkv[:, : H * hd].reshape(-1, H, hd), L["q_norm"])
        k = self.rms(qkv[:, H * hd : (H + K) * hd].reshape(-1, K, hd), L["k_norm"])
        return torch.cat([q.flatten(1), k.flatten(1), qkv[:, (H + K) * hd :]], 1)

    def rope(self, x, cos, sin):
        # x [N, heads, hd]; cos, sin [N, 1, hd]
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin

    def forward(self, tokens, pos, kvrow, groups, kv, last):
        """tokens, pos, kvrow: [N] packed over the batch; kvrow is each
        token's row in the flattened KV blocks (block * block_size +
        offset). groups: the attention plan (see attend); kv: paged.PagedKV.
        Returns logits [len(last), vocab] for the packed rows in last."""
        cfg = self.cfg
        H, K, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
        x = self.embed[tokens]
        cos = sin = None
        if self.kern is None:
            cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)
        h = None
        for li, L in enumerate(self.layers):
            kc, vc = kv.kc[li], kv.vc[li]
            x, h = self.add_norm(x, h, L["ln1"])
            qkv = self.qk_norm(F.linear(h, L["qkv"], L.get("qkv_b")), L)
            if self.kern is not None:  # rotary embedding and KV write in one kernel
                qk = self.kern.rope_kv(qkv, kc, vc, kvrow, pos, self.cos, self.sin, H, K)
            else:
                qk = self.rope(qkv[:, : (H + K) * hd].view(-1, H + K, hd), cos, sin)
            q, k = qk[:, :H], qk[:, H:]
            v = qkv[:, (H + K) * hd :].view(-1, K, hd)
            if self.kern is None:
                kc.view(-1, K, hd)[kvrow] = k
                vc.view(-1, K, hd)[kvrow] = v
            a = self.attend(q, k, v, qkv, kc, vc, kv, groups)
            x, h = self.add_norm(x, F.linear(a, L["o"]), L["ln2"])
            h = F.linear(self.swiglu(F.linear(h, L["gate_up"])), L["down"])
        x = self.rms(x[last] + h[last], self.norm)
        return F.linear(x, self.lm_head).float()

    def add_norm(self, x, d, w):
        """(x + d, rms(x + d) * w); d is skipped when None (the first
        layer: x is the embedding). Returns the new residual and the
        normalised rows."""
        if self.kern is not None:
            return self.kern.add_rms(x, d, w, self.cfg.eps)
        if d is not None:
            x = x + d
        return x, self.rms(x, w)

    def swiglu(self, gu):
        if self.kern is not None:
            return self.kern.silu_mul(gu)
        g, u = gu.chunk(2, dim=-1)
        return F.silu(g) * u

    def forward_decode(self, tokens, pos, rows, kv):
        """One token per sequence, all on the device: tokens, pos and rows
        (the sequences' block-table rows) [B] (int64). Needs the CUDA
        kernels (self.kern). Returns logits [B, vocab] (float32)."""
        cfg = self.cfg
        kern = self.kern
        x = self.embed[tokens]
        h = None
        for li, L in enumerate(self.layers):
            x, h = kern.add_rms(x, h, L["ln1"], cfg.eps)
            qkv = self.qk_norm(F.linear(h, L["qkv"], L.get("qkv_b")), L)
            a = kern.decode_attention(qkv, kv.kc[li], kv.vc[li], kv.table, rows, pos, self.cos, self.sin,
                                      cfg.heads, cfg.kv_heads, cfg.context)
            x, h = kern.add_rms(x, F.linear(a, L["o"]), L["ln2"], cfg.eps)
            h = F.linear(kern.silu_mul(F.linear(h, L["gate_up"])), L["down"])
        _, x = kern.add_rms(x, h, self.norm, cfg.eps)
        return F.linear(x, self.lm_head).float()

    def gather(self, kc, table, rows, n):
        """The first n positions of the sequences in block-table rows
        [B], as [B, kv_heads, W, head_dim] with W >= n a whole number of
        blocks (positions past a sequence's length hold stale values)."""
        bs = kc.shape[1]
        nb = -(-n // bs)
        idx = table[rows, :nb].long()
        B = idx.shape[0]
        return kc[idx].reshape(B, nb * bs, kc.shape[2], kc.shape[3]).transpose(1, 2)

    def chunk_kv(self, kc, blocks, n):
        """The first n positions held by blocks (a device tensor of block
        ids in order) as [kv_heads, n, head_dim]."""
        return kc[blocks].flatten(0, 1)[:n].transpose(0, 1)

    def decode_mask(self, lens, width, dtype):
        """[B, 1, 1, 1, width]: 0 where a position is within the length,
        minus infinity past it."""
        ar = torch.arange(width, device=lens.device).unsqueeze(0)
        m = torch.zeros(lens.shape[0], width, device=lens.device, dtype=dtype)
        return m.masked_fill(ar >= lens.unsqueeze(1), float("-inf")).view(-1, 1, 1, 1, width)

    def attend(self, q, k, v, qkv, kc, vc, kv, groups):
        """groups: ("decode", rows, trows, maxlen, lens) for the one-token
        sequences (packed rows, block-table rows, the longest length and
        each length, the new token included), ("chunk", start, end, trow,
        p, blocks) for a chunk of end-start tokens at positions p.. of one
        sequence whose first blocks (a device tensor, enough for p +
        end - start positions) hold its prefix and the chunk. k and v are the step's own keys and values (already in
        the cache); qkv the projections before the rotary embedding."""
        cfg = self.cfg
        H, K, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
        rep = H // K
        if self.sdpa:
            return self.attend_sdpa(q, k, v, qkv, kc, vc, kv, groups)
        out = torch.empty(q.shape[0], H * hd, device=q.device, dtype=q.dtype)
        scale = 1.0 / math.sqrt(hd)
        for g in groups:
            if g[0] == "decode":
                _, rows, trows, maxlen, lens = g
                if self.kern is not None:
                    out[rows] = self.attend_decode_kern(qkv, kc, vc, kv, g)
                    continue
                B = rows.shape[0]
                kk = self.gather(kc, kv.table, trows, maxlen)
                vv = self.gather(vc, kv.table, trows, maxlen)
                mask = self.decode_mask(lens, kk.shape[2], q.dtype)
                qd = q[rows].view(B, K, rep, 1, hd)
                s = torch.matmul(qd, kk.unsqueeze(2).transpose(-1, -2)) * scale + mask
                o = torch.matmul(torch.softmax(s.float(), dim=-1).to(q.dtype), vv.unsqueeze(2))
                out[rows] = o.reshape(B, H * hd)
            else:
                _, a, b, trow, p, blocks = g
                T, L = b - a, p + b - a
                qc = q[a:b].transpose(0, 1).reshape(K, rep, T, hd)
                kk = self.chunk_kv(kc, blocks, L).unsqueeze(1)  # [K, 1, L, hd]
                vv = self.chunk_kv(vc, blocks, L).unsqueeze(1)
                s = torch.matmul(qc, kk.transpose(-1, -2)) * scale
                i = torch.arange(T, device=q.device).unsqueeze(1) + p
                j = torch.arange(L, device=q.device).unsqueeze(0)
                s = s.masked_fill(j > i, float("-inf"))
                o = torch.matmul(torch.softmax(s.float(), dim=-1).to(q.dtype), vv)
                out[a:b] = o.reshape(H, T, hd).transpose(0, 1).reshape(T, H * hd)
        return out

    def attend_decode_kern(self, qkv, kc, vc, kv, g):
        """A decode group through the Triton kernel: rotary embedding,
        KV write (again, same values) and attention over the blocks."""
        _, rows, trows, _, lens = g
        return self.kern.decode_attention(qkv[rows].contiguous(), kc, vc, kv.table, trows, lens - 1, self.cos, self.sin,
                                          self.cfg.heads, self.cfg.kv_heads, self.cfg.context)

    def attend_varlen(self, q, kc, vc, g, out):
        """A varlen group: ("varlen", qrows, krows, cu_q, cu_k, max_q,
        max_k) for every prompt chunk of the step: the chunks' packed rows
        (None: all rows, in order), the rows of the flattened KV cache
        holding each chunk's prefix and itself, and their cumulative
        lengths (int32). Returns the output when it is the whole step."""
        _, qrows, krows, cu_q, cu_k, max_q, max_k = g
        K, hd = self.cfg.kv_heads, self.cfg.head_dim
        qq = q if qrows is None else q[qrows]
        kk = kc.view(-1, K, hd)[krows]
        vv = vc.view(-1, K, hd)[krows]
        o = _flash_varlen(qq, kk, vv, cu_q, cu_k, max_q, max_k)
        o = o.reshape(o.shape[0], -1)
        if qrows is None:
            return o
        out[qrows] = o
        return None

    def attend_sdpa(self, q, k, v, qkv, kc, vc, kv, groups):
        """attend with F.scaled_dot_product_attention (torch 2.5+, CUDA).
        Chunks that start a sequence (position 0) need no cache: those of
        one length run as one causal batch on the step's own k and v.
        One-token sequences use the Triton decode kernel when it runs."""
        H, hd = self.cfg.heads, self.cfg.head_dim
        out = torch.empty(q.shape[0], H * hd, device=q.device, dtype=q.dtype)
        for g in groups:
            if g[0] == "varlen":
                whole = self.attend_varlen(q, kc, vc, g, out)
                if whole is not None:
                    return whole
        fresh = {}
        for g in groups:
            if g[0] == "chunk" and g[4] == 0:
                fresh.setdefault(g[2] - g[1], []).append(g[1])
        for T, starts in fresh.items():
            n = len(starts)
            adjacent = starts == list(range(starts[0], starts[0] + n * T, T))
            if adjacent:  # views, no copies
                sl = slice(starts[0], starts[0] + n * T)
                qq, kk, vv = (t[sl].view(n, T, -1, hd).transpose(1, 2) for t in (q, k, v))
            else:
                qq, kk, vv = (torch.stack([t[a : a + T] for a in starts]).transpose(1, 2) for t in (q, k, v))
            # Every query head its own key and value head: the flash kernel
            # then runs the causal mask itself (with GQA it may not).
            K = kk.shape[1]
            if H > K:
                kk, vv = (t.unsqueeze(2).expand(n, K, H // K, T, hd).reshape(n, H, T, hd) for t in (kk, vv))
            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
            o = o.transpose(1, 2).reshape(n * T, H * hd)
            if adjacent and n * T == q.shape[0]:
                return o  # the whole step is this one group
            if adjacent:
                out[starts[0] : starts[0] + n * T] = o
            else:
                for i, a in enumerate(starts):
                    out[a : a + T] = o[i * T : (i + 1) * T]
        for g in groups:
            if g[0] == "varlen" or (g[0] == "chunk" and g[4] == 0):
                continue
            if g[0] == "decode":
                _, rows, trows, maxlen, lens = g
                if self.kern is not None:
                    out[rows] = self.attend_decode_kern(qkv, kc, vc, kv, g)
                    continue
                B = rows.shape[0]
                kk = self.gather(kc, kv.table, trows, maxlen)
                vv = self.gather(vc, kv.table, trows, maxlen)
                W = kk.shape[2]
                mask = self.decode_mask(lens, W, q.dtype)
                o = F.scaled_dot_product_attention(q[rows].unsqueeze(2), kk, vv, attn_mask=mask.view(B, 1, 1, W), enable_gqa=True)
                out[rows] = o.reshape(B, H * hd)
            else:
                _, a, b, trow, p, blocks = g
                T, L = b - a, p + b - a
                kk = self.chunk_kv(kc, blocks, L).unsqueeze(0)  # [1, K, L, hd]
                vv = self.chunk_kv(vc, blocks, L).unsqueeze(0)
                qq = q[a:b].transpose(0, 1).unsqueeze(0)
                if causal_lower_right is not None:
                    # A chunk after its sequence's first: queries are the last
                    # T of L positions. The lower-right causal bias keeps the
                    # flash kernel (an explicit mask with GQA falls back to
                    # the math kernel, milliseconds per layer); heads expanded
                    # as for fresh chunks.
                    K = kk.shape[1]
                    kk, vv = (t.unsqueeze(2).expand(1, K, H // K, L, hd).reshape(1, H, L, hd) for t in (kk, vv))
                    o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=causal_lower_right(T, L))
                else:
                    i = torch.arange(T, device=q.device).unsqueeze(1) + p
                    allowed = torch.arange(L, device=q.device).unsqueeze(0) <= i
                    o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=allowed, enable_gqa=True)
                out[a:b] = o[0].transpose(0, 1).reshape(T, H * hd)
        return out


def _kernels(cfg, device, dtype):
    """The Triton kernels module when it runs here and agrees with the
    plain torch code on a small case; None otherwise (the torch code runs)."""
    if os.environ.get("MLXSERVING_TORCH_KERNELS", "1") == "0":
        return None
    try:
        import kernels
        if not kernels.usable(cfg, dtype):
            return None
        err = kernels.self_check(device, dtype, cfg.heads, cfg.kv_heads, cfg.head_dim)
    except Exception as e:  # no Triton, or it cannot compile for this device
        log.warning("Triton kernels unavailable, using plain torch: %s", e)
        return None
    if err is not None:
        log.warning("Triton kernels disagree with torch (%s); using plain torch", err)
        return None
    return kernels


def _flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k):
    """Causal flash attention over packed variable-length sequences:
    q [Tq, H, hd], k and v [Tk, K, hd] (K divides H), cu_q and cu_k the
    int32 cumulative lengths. A sequence's queries are the last of its
    keys (the causal mask aligned bottom-right, as flash aligns it)."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False)[0]


def _varlen_ok(device, dtype, H, K, hd):
    """Whether the varlen flash call runs here and agrees with SDPA on
    a fresh chunk and on one continuing its prefix (bf16/fp16 only)."""
    if dtype not in (torch.bfloat16, torch.float16) or os.environ.get("MLXSERVING_VARLEN", "1") == "0":
        return False
    try:
        from torch.nn.attention.bias import causal_lower_right
        g = torch.Generator(device="cpu").manual_seed(0)
        lens = [(5, 5), (3, 11)]  # (queries, keys): fresh, then continuing
        qs = [torch.randn(t, H, hd, generator=g) for t, _ in lens]
        ks = [torch.randn(n, K, hd, generator=g) for _, n in lens]
        vs = [torch.randn(n, K, hd, generator=g) for _, n in lens]
        cu = lambda xs: torch.tensor([0] + [sum(xs[: i + 1]) for i in range(len(xs))], dtype=torch.int32, device=device)
        dv = lambda xs: torch.cat(xs).to(device=device, dtype=dtype)
        got = _flash_varlen(dv(qs), dv(ks), dv(vs), cu([t for t, _ in lens]), cu([n for _, n in lens]),
                            max(t for t, _ in lens), max(n for _, n in lens)).float().cpu()
        at = 0
        for (t, n), qq, kk, vv in zip(lens, qs, ks, vs):
            rep = H // K
            kk, vv = (x.repeat_interleave(rep, dim=1).transpose(0, 1).unsqueeze(0) for x in (kk, vv))
            want = F.scaled_dot_product_attention(qq.transpose(0, 1).unsqueeze(0), kk, vv,
                                                  attn_mask=causal_lower_right(t, n))[0].transpose(0, 1)
            if (got[at : at + t] - want).abs().max().item() > 0.05:
                log.warning("varlen flash attention disagrees with SDPA; chunks attend one by one")
                return False
            at += t
        return True
    except (RuntimeError, TypeError, AttributeError, ImportError) as e:
        log.warning("varlen flash attention unavailable (%s); chunks attend one by one", e)
        return False


def _sdpa_gqa():
    """Whether this torch has scaled_dot_product_attention with GQA."""
    if not hasattr(F, "scaled_dot_product_attention"):
        return False
    try:
        F.scaled_dot_product_attention(torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4), enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False

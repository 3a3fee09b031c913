"""The decoder every family runs, in plain torch.

config.py describes the model (the architecture table); this module runs
any description: RMSNorm in its three kinds (Llama, OLMo 2, Gemma's 1 + w),
the norms where the family puts them (before, around or after attention
and the MLP), rotary embeddings (full or partial, one table per layer
kind: Gemma 3's local and global bases, Phi-3's longrope), QK norm per head
or over the whole projection, grouped-query attention with sliding
windows and attention sinks (gpt_oss: gptoss.py), Gemma's scale and
soft-capping, SwiGLU or GELU-tanh MLPs and mixtures of experts (moe.py). Tokens of a step are packed into one
[N, hidden] matrix for the projections and the MLP; attention runs per
group: all one-token sequences together, each multi-token chunk on its
own, reading KV through block tables (paged.py).

On CUDA the Triton kernels (kernels.py) add the residual and norm, rotate
and cache q and k, and run decode attention (sliding windows bound the
keys they walk; gpt_oss's sinks join its softmax), and prompt chunks
attend in one varlen flash call (window_size_left for sliding layers;
sinks rescale its output by its log-sum-exp: gptoss.with_sinks). What
they cannot do falls back to the plain torch attention, said where it
happens.
"""
import logging

import torch
import torch.nn.functional as F

try:  # torch 2.3+: causal masks aligned to the end of the keys, run by the flash kernels
    from torch.nn.attention.bias import causal_lower_right
except ImportError:
    causal_lower_right = None

from ..settings import Settings
from . import gemma, gptoss, kvcache, moe, phi3, quant, rope, w8a8
from .st import Checkpoint

log = logging.getLogger("decoder")

# Where the language model's weights are: model. (CausalLM checkpoints),
# language_model.model. (gemma3 written by transformers < 4.52 and Google's
# files) or model.language_model. (newer transformers).
# The bare model's save_pretrained (Qwen3Model: Qwen3-Embedding) has none.
PREFIXES = ("model.", "language_model.model.", "model.language_model.", "")
# The norms of a layer by layout: (before attention, after attention,
# before the MLP, after the MLP); None where the layout has none.
NORMS = {
    "pre": ("input_layernorm", None, "post_attention_layernorm", None),
    "sandwich": ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"),
    "post": (None, "post_attention_layernorm", None, "post_feedforward_layernorm"),
}
NORM_KEYS = ("ln_in", "attn_post", "ln_ffn", "mlp_post")


class Decoder:
    """Weights and the forward pass. The KV cache is owned by the caller
    (paged.PagedKV): kc[l] and vc[l] are [blocks, block_size, kv_heads,
    head_dim], read through layer l's group's block table
    (kv.table_of(l)); positions' rows and blocks come per group. They hold
    what self.kvq (kvcache.KVFormat) stores: every write and read of them
    goes through it (kv_dtype "fp8": float8 e4m3 with the layer's scales)."""

    def __init__(self, directory, cfg, device, dtype, quantize=None, tp=None, settings=None, kv_dtype="auto"):
        settings = settings or Settings()
        self.cfg, self.device, self.dtype = cfg, device, dtype
        self.tp = tp  # tp.Shard: this rank's share of a tensor-parallel model, or None
        fam = cfg.family
        ck = Checkpoint(directory)
        h = cfg.hidden
        # Quantized checkpoints (quant.py): get dequantizes, self.lin keeps
        # the projections quantized where kernels run them.
        qz = quant.Loader(ck, cfg.quant, device, dtype, quantize, settings.fp8_scaled_mm)
        get, self.lin = qz.get, qz.linear
        if tp is not None:  # the rank's slices of the split projections
            get = self.lin = tp.loader(ck, device, dtype)
        prefix = next((p for p in PREFIXES if ck.has(p + "embed_tokens.weight")), PREFIXES[0])
        self.embed = get(prefix + "embed_tokens.weight", (cfg.vocab, h))
        self.embed_scale = gemma.embed_scale(cfg, device, dtype)
        self.layers = [self.load_layer(get, ck, prefix + "layers.%d." % i, i) for i in range(cfg.layers)]
        self.norm = get(prefix + "norm.weight", (h,))
        heads = [n for n in ("lm_head.weight", "language_model.lm_head.weight") if ck.has(n)]
        self.lm_head = self.embed if cfg.tie or not heads else get(heads[0], (cfg.vocab, h))
        fp8 = kv_dtype == "fp8"
        scales = kvcache.checkpoint_scales(ck, prefix, cfg.layers) if fp8 else [(1.0, 1.0)] * cfg.layers
        self.kvq = kvcache.KVFormat(kv_dtype, device, dtype, scales)
        if tp is not None:
            self.lm_head = tp.vocab_rows(self.lm_head)
        # Rotary tables: one per layer kind (Gemma 3's sliding layers
        # rotate with their own base and no scaling).
        self.rope_ctx = cfg.context
        kinds = [(cfg.theta, cfg.rope_scaling)]
        if cfg.local_theta is not None:
            kinds.append((cfg.local_theta, None))
        self.tabs, self.longrope = [], False
        for theta, rs in kinds:
            (cos, sin), lr = rope.tables(cfg, theta, rs)
            self.longrope = self.longrope or lr
            self.tabs.append((cos.to(device=device, dtype=dtype), sin.to(device=device, dtype=dtype)))
        self.rope_old = min(rope.longrope(cfg)[3], cfg.context) if self.longrope else 0
        self.tab_of = [1 if cfg.local_theta is not None and w else 0 for w in cfg.windows]
        self.cos, self.sin = self.tabs[0]
        self.norm_kind = fam.norm
        fast = device.type == "cuda"
        # Soft-capped attention scores (Gemma 2) are beyond SDPA, flash and
        # the Triton kernels: such a model attends with the plain torch
        # code throughout, and so runs no varlen prompt attention,
        # prompt-step graphs (prefill.py) or kernel decode chain.
        capped = cfg.attn_softcap > 0
        flash = fast and not capped and _sdpa_gqa()
        # Attention sinks (gpt_oss) are beyond SDPA alone: the decode
        # kernel and the varlen call take them, other chunks attend with
        # the plain torch code (gptoss.py).
        self.sdpa = flash and not fam.sinks
        if self.sdpa and hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
            # cuDNN's attention builds an execution plan for every new query
            # length (about 100 ms each); prompt chunks come in every length,
            # so a server met a new one almost every step. The flash kernel
            # needs no plan.
            torch.backends.cuda.enable_cudnn_sdp(False)
        self.fused_rms = fast and hasattr(F, "rms_norm") and fam.norm == "llama"
        # The kernels read FP8 KV as torch's float8_e4m3fn only.
        kern_kv = self.kvq.storage in (dtype, getattr(torch, "float8_e4m3fn", None))
        self.kern = _kernels(cfg, device, dtype, self.kvq.storage) if fast and not capped and settings.kernels and kern_kv else None
        # One-row products of 16-bit weights in Triton's row loop, and the
        # norms inside the products after them (quant.row_loop_ok).
        self.row_loop = self.kern is not None and quant.row_loop_ok(device, dtype)
        self.prefetch = settings.attn_prefetch  # the decode attention kernel's (kernels.decode_attention)
        # Every prompt chunk of a step in one flash call per layer (varlen,
        # each chunk over its prefix and itself), instead of a handful of
        # calls and copies per chunk: steps under load carry several
        # chunks and were bound by launching them.
        self.varlen = flash and settings.varlen and _varlen_ok(device, dtype, cfg)
        self.moe = moe.Experts(cfg, device, dtype, self.layers, self.act_mul, kernels=fast and settings.kernels) if cfg.experts else None
        # CUDA graphs need a step without host syncs: the experts' loop
        # fallback counts tokens on the host, and the grouped GEMM must
        # capture too (moe.Experts.capturable).
        self.graphable = self.moe is None or self.moe.capturable
        # The step's LoRA adapters (lora.Plan, DensePlan or SegmentPlan), set by
        # the backend around a forward pass whose rows run adapters; None:
        # the base alone.
        self.lora = None

    def load_layer(self, get, ck, p, i):
        cfg, fam = self.cfg, self.cfg.family
        h, hd, H, K = cfg.hidden, cfg.head_dim, cfg.heads, cfg.kv_heads
        L = {}
        for key, name in zip(NORM_KEYS, NORMS[fam.layout]):
            if name is not None:
                L[key] = get(p + name + ".weight", (h,))
        a = p + "self_attn."
        if fam.attn == "fused":
            L["qkv"] = phi3.qkv(get, cfg, a)
        else:
            lin = self.lin
            L["qkv"] = quant.cat([lin(a + "q_proj.weight", (H * hd, h)), lin(a + "k_proj.weight", (K * hd, h)),
                                  lin(a + "v_proj.weight", (K * hd, h))], self.dtype)
            if cfg.bias:
                L["qkv_b"] = torch.cat([get(a + "q_proj.bias", (H * hd,)), get(a + "k_proj.bias", (K * hd,)),
                                        get(a + "v_proj.bias", (K * hd,))])
        L["o"] = self.lin(a + "o_proj.weight", (h, H * hd))
        if fam.o_bias:
            L["o_b"] = get(a + "o_proj.bias", (h,))
        if fam.sinks:  # per query head, float32 (the kernels' operand; probs groups them as attend does)
            L["sinks"] = get(a + "sinks", (H,)).float()
        if fam.qk_norm == "head":  # each head of q and k, before the rotary embedding
            L["q_norm"] = get(a + "q_norm.weight", (hd,))
            L["k_norm"] = get(a + "k_norm.weight", (hd,))
        elif fam.qk_norm == "whole":  # OLMo 2: the whole projections, before the head split
            L["q_norm"] = get(a + "q_norm.weight", (H * hd,))
            L["k_norm"] = get(a + "k_norm.weight", (K * hd,))
        if cfg.experts and cfg.sparse[i]:
            L.update(gptoss.load(get, ck, cfg, p, self.device, self.dtype) if fam.mlp == "gpt_oss" else moe.load(get, cfg, p))
        elif fam.mlp == "fused":
            L["gate_up"] = phi3.gate_up(get, cfg, p + "mlp.")
            L["down"] = get(p + "mlp.down_proj.weight", (h, cfg.intermediate))
        else:
            m = p + "mlp."
            L["gate_up"] = quant.cat([self.lin(m + "gate_proj.weight", (cfg.intermediate, h)),
                                      self.lin(m + "up_proj.weight", (cfg.intermediate, h))], self.dtype)
            L["down"] = self.lin(m + "down_proj.weight", (h, cfg.intermediate))
        return L

    def rms(self, x, w):
        """The family's RMSNorm of x by w; w None returns x."""
        if w is None:
            return x
        if self.fused_rms:
            return F.rms_norm(x, (x.shape[-1],), w, self.cfg.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.eps)
        if self.norm_kind == "gemma":  # (1 + w), in float32, one rounding
            return (xf * (1.0 + w.float())).to(x.dtype)
        if self.norm_kind == "olmo2":  # w times the float32 rows, one rounding
            return (w.float() * xf).to(x.dtype)
        return w * xf.to(x.dtype)

    def qk_norm(self, qkv, L):
        """qkv with q and k RMS-normalised (the layer's q_norm and k_norm:
        per head, or over the whole projection), when the family has them;
        the kernels then rotate and cache the normalised rows."""
        if "q_norm" not in L:
            return qkv
        H, K, hd = self.cfg.heads, self.cfg.kv_heads, self.cfg.head_dim
        n = qkv.shape[0]
        per = self.cfg.family.qk_norm == "head"
        q = self.rms(qkv[:, : H * hd].reshape(n * H, hd) if per else qkv[:, : H * hd], L["q_norm"])
        k = self.rms(qkv[:, H * hd : (H + K) * hd].reshape(n * K, hd) if per else qkv[:, H * hd : (H + K) * hd], L["k_norm"])
        return torch.cat([q.reshape(n, H * hd), k.reshape(n, K * hd), qkv[:, (H + K) * hd :]], 1)

    def rope(self, x, cos, sin):
        """x [N, heads, hd]; cos, sin [N, 1, hd]: pairs (i, i + rot/2) of
        the first rot dims rotate; the tables hold 1 and 0 past them."""
        r = self.cfg.rot_dim
        half = r // 2
        rot = torch.cat([-x[..., half:r], x[..., :half], x[..., r:]], dim=-1)
        return x * cos + rot * sin

    def rope_rows(self, p, end):
        """The rotary table rows of positions p .. end - 1, fed in one step
        by one sequence: the positions, except under longrope, where the
        long factors rotate every token of a step that reaches past the
        original context (transformers switches on the sequence length
        it is called with: a prompt longer than the original context is
        rotated with the long factors throughout, and each token from the
        original context on with the long ones). Rows past the context
        hold the long rotation of positions below the original context.
        Keys already cached keep the rotation they were written with, as
        in transformers' cache; a one-token step's row is its position."""
        old = self.rope_old
        if not self.longrope or end <= old:
            return range(p, end)
        return [j + self.rope_ctx if j < old else j for j in range(p, end)]

    def add_norm(self, x, d, w, then=None):
        """(x + d, norm(x + d) by w); d is skipped when None (the first
        layer: x is the embedding), the norm when w is None (OLMo 2).
        Returns the new residual and the normalised rows. then: the
        weight the rows go to next; where its product quantizes them
        first (w8a8.given_group), the kernel writes their codes too."""
        if d is not None and d.dim() == 3 and (w is None or self.kern is None):
            d = d.sum(dim=1)  # a mixture's k choices (mlp, summed=False)
        if w is None:
            x = x if d is None else x + d
            return x, x
        if self.kern is not None:
            group = w8a8.given_group(then, x.shape[0], x.device, x.dtype)
            if group:
                x, h, q, s = self.kern.add_rms(x, d, w, self.cfg.eps, self.norm_kind, quant=group)
                self.kern.quant_triton.give(h, q, s)
                return x, h
            return self.kern.add_rms(x, d, w, self.cfg.eps, self.norm_kind)
        if d is not None:
            x = x + d
        return x, self.rms(x, w)

    def embed_rows(self, tokens):
        x = self.embed[tokens]
        if self.embed_scale is not None:  # Gemma: sqrt(hidden) in the weights' dtype
            x = x * self.embed_scale
        return x

    def norm_proj(self, x, d, w, L, name, li):
        """add_norm then proj: (x + d, the projection name of its
        normalised rows), in one launch where quant.norm_linear runs
        (row_loop; one row into a product quant.norm_fits takes, an FP8
        or 16-bit weight, no bias or adapters): at one token a step the
        norm's kernel costs about as much as a product's tail."""
        if self.row_loop and self.lora is None and w is not None and name + "_b" not in L \
                and (d is None or d.dim() == 2):
            fused = quant.norm_linear(x, d, w, self.cfg.eps, self.norm_kind, L[name], True)
            if fused is not None:
                return fused
        x, h = self.add_norm(x, d, w, L.get(name))
        return x, self.proj(h, L, name, li)

    def mlp(self, h, L, li=0, summed=True):
        """The MLP of rows h; summed False lets a mixture's fused path
        return its k choices unsummed, [N, k, hidden], for add_norm's
        kernel to sum."""
        if "router" in L:
            return self.moe.forward(h, L, self.act_mul, summed=summed)
        return self.mlp_down(self.proj(h, L, "gate_up", li), L, li)

    def mlp_down(self, gu, L, li):
        """The rest of a dense MLP from its gate_up projection gu."""
        if self.kern is not None and self.lora is None and self.cfg.family.act == "silu" and "down_b" not in L:
            y = quant.silu_linear(gu, L["down"], self.row_loop)  # SwiGLU inside the down product where it runs
            if y is not None:
                return self.reduce(y)
        return self.reduce(self.proj(self.act_mul(gu, L.get("down")), L, "down", li))

    def proj(self, x, L, name, li):
        """Layer li's packed projection name of rows x (its bias where it
        has one), plus the step's adapters' deltas (lora.py); a plan that
        can start the delta from x alone does so first (begin: on a side
        stream, beside the projection's GEMM)."""
        if self.lora is None:
            return quant.linear(x, L[name], L.get(name + "_b"), self.row_loop)
        started = self.lora.begin(x, li, name)
        try:
            y = quant.linear(x, L[name], L.get(name + "_b"), self.row_loop)
        except BaseException:
            # The begun work joins the step's stream before the step's
            # tensors (x, the plan's segments) can be freed and reused.
            self.lora.join(started, x)
            raise
        return self.lora.add(y, x, li, name, started)

    def reduce(self, x):
        """x summed over the tensor-parallel ranks (the output of o or
        down, whose inputs are split); x itself without them."""
        return x if self.tp is None else self.tp.reduce(x)

    def act_mul(self, gu, then=None):
        """act(gate) * up of the packed [N, 2 * inter] gate and up rows;
        then: as add_norm's."""
        if self.cfg.family.act == "clamped_glu":
            return gptoss.act_mul(gu, self.cfg.swiglu_limit)
        if self.cfg.family.act == "gelu_tanh":
            g, u = gu.chunk(2, dim=-1)
            return F.gelu(g, approximate="tanh") * u
        if self.kern is not None:
            group = w8a8.given_group(then, gu.shape[0], gu.device, gu.dtype)
            if group:
                y, q, s = self.kern.silu_mul(gu.contiguous(), quant=group)
                self.kern.quant_triton.give(y, q, s)
                return y
            return self.kern.silu_mul(gu.contiguous())
        g, u = gu.chunk(2, dim=-1)
        return F.silu(g) * u

    def logits(self, x):
        out = F.linear(x, self.lm_head)
        if self.tp is not None:  # every rank's vocabulary shard
            out = self.tp.gather_logits(out)
        out = out.float()
        if self.cfg.final_softcap:  # Gemma 2
            out = gemma.softcap(out, self.cfg.final_softcap)
        return out

    def forward(self, tokens, pos, kvrow, groups, kv, last, rpos=None, hidden=None):
        """tokens, pos: [N] packed over the batch; kvrow: per block group
        (paged.Layout), each token's row in the flattened KV blocks (block *
        block_size + offset), [N]. groups: the attention plan (see attend); kv: paged.PagedKV;
        rpos: each token's rotary table row (rope_rows; None: pos).
        Returns logits [len(last), vocab] for the packed rows in last;
        with hidden (packed rows of pooled sequences), also those rows'
        last hidden state after the final norm, [len(hidden), hidden_size]."""
        cfg = self.cfg
        H, K, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
        rp = pos if rpos is None else rpos
        x = self.embed_rows(tokens)
        rows = None
        if self.kern is None:
            rows = [(c[rp].unsqueeze(1), s[rp].unsqueeze(1)) for c, s in self.tabs]
        d = None
        for li, L in enumerate(self.layers):
            kc, vc, kr = kv.kc[li], kv.vc[li], kvrow[kv.group_of[li]]
            x, h = self.add_norm(x, d, L.get("ln_in"), L.get("qkv"))
            qkv = self.qk_norm(self.proj(h, L, "qkv", li), L)
            t = self.tab_of[li]
            ks, vs = self.kvq.scales[li]
            if self.kern is not None:  # rotary embedding and KV write in one kernel
                qk = self.kern.rope_kv(qkv, kc, vc, kr, rp, self.tabs[t][0], self.tabs[t][1], H, K, cfg.rot_dim, ks, vs)
            else:
                qk = self.rope(qkv[:, : (H + K) * hd].view(-1, H + K, hd), *rows[t])
            q, k = qk[:, :H], qk[:, H:]
            v = qkv[:, (H + K) * hd :].view(-1, K, hd)
            if self.kern is None:
                self.kvq.store(kc.view(-1, K, hd), kr, k, ks)
                self.kvq.store(vc.view(-1, K, hd), kr, v, vs)
            a = self.rms(self.reduce(self.proj(self.attend(q, k, v, qkv, kc, vc, kv, groups, li), L, "o", li)), L.get("attn_post"))
            x, h = self.add_norm(x, a, L.get("ln_ffn"), L.get("gate_up"))
            d = self.rms(self.mlp(h, L, li), L.get("mlp_post"))
        out = self.logits(self.rms(x[last] + d[last], self.norm))
        if hidden is None:
            return out
        return out, self.rms(x[hidden] + d[hidden], self.norm)

    def forward_decode(self, tokens, pos, rows, kv):
        """One token per sequence, all on the device: tokens, pos and rows
        (the sequences' block-table rows) [B] (int64). Needs the CUDA
        kernels (self.kern). Returns logits [B, vocab] (float32)."""
        cfg = self.cfg
        x = self.embed_rows(tokens)
        d = None
        # Per-head QK norms run inside the attention kernel, and a
        # mixture's sum over its k choices inside the next add_norm's:
        # at one token a layer, each of those small kernels cost about as
        # much as the weights it sat between.
        head_norm = cfg.family.qk_norm == "head"
        for li, L in enumerate(self.layers):
            x, qkv = self.norm_proj(x, d, L.get("ln_in"), L, "qkv", li)
            qkn = None
            if head_norm:
                qkn = (L["q_norm"], L["k_norm"], cfg.eps, self.norm_kind)
            else:
                qkv = self.qk_norm(qkv, L)
            cos, sin = self.tabs[self.tab_of[li]]
            a = self.kern.decode_attention(qkv, kv.kc[li], kv.vc[li], kv.table_of(li), rows, pos, cos, sin, cfg.heads, cfg.kv_heads,
                                           cfg.context, cfg.scale, cfg.windows[li], cfg.rot_dim, self.prefetch, *self.kvq.scales[li],
                                           sinks=L.get("sinks"), qk_norm=qkn, early=True)
            a = self.rms(self.reduce(self.proj(a, L, "o", li)), L.get("attn_post"))
            post = L.get("mlp_post")
            if "router" in L:
                x, h = self.add_norm(x, a, L.get("ln_ffn"), L.get("gate_up"))
                y = self.mlp(h, L, li, summed=post is not None)
            else:
                x, gu = self.norm_proj(x, a, L.get("ln_ffn"), L, "gate_up", li)
                y = self.mlp_down(gu, L, li)
            d = self.rms(y, post)
        _, x = self.add_norm(x, d, self.norm)
        return self.logits(x)

    def gather(self, kc, table, rows, n, scale):
        """The first n positions of the sequences in block-table rows
        [B], as [B, kv_heads, W, head_dim] with W >= n a whole number of
        blocks (positions past a sequence's length hold stale values),
        read with the layer's scale of kc."""
        bs = kc.shape[1]
        nb = -(-n // bs)
        idx = table[rows, :nb].long()
        B = idx.shape[0]
        return self.kvq.load(kc, idx, scale).reshape(B, nb * bs, kc.shape[2], kc.shape[3]).transpose(1, 2)

    def chunk_kv(self, kc, blocks, n, scale):
        """The first n positions held by blocks (a device tensor of block
        ids in order) as [kv_heads, n, head_dim], read with the layer's
        scale of kc."""
        return self.kvq.load(kc, blocks, scale).flatten(0, 1)[:n].transpose(0, 1)

    def decode_mask(self, lens, width, dtype, window=0):
        """[B, 1, 1, 1, width]: 0 where a position is within the length
        (and the window: after lens - 1 - window), minus infinity
        elsewhere."""
        ar = torch.arange(width, device=lens.device).unsqueeze(0)
        m = torch.zeros(lens.shape[0], width, device=lens.device, dtype=dtype)
        out = ar >= lens.unsqueeze(1)
        if window:
            out = out | (ar < lens.unsqueeze(1) - window)
        return m.masked_fill(out, float("-inf")).view(-1, 1, 1, 1, width)

    def scores(self, q, k):
        """q . k scaled, soft-capped where the family caps (Gemma 2), in
        q's dtype."""
        s = torch.matmul(q, k) * self.cfg.scale
        if self.cfg.attn_softcap:
            s = gemma.softcap(s, self.cfg.attn_softcap)
        return s

    def attend(self, q, k, v, qkv, kc, vc, kv, groups, li):
        """groups: ("decode", rows, trows, maxlen, lens) for the one-token
        sequences (packed rows, block-table rows, the longest length and
        each length, the new token included), ("chunk", start, end, trow,
        p, blocks) for a chunk of end-start tokens at positions p.. of one
        sequence whose first blocks (per block group a device tensor,
        enough for p + end - start positions) hold its prefix and the
        chunk; a sliding group's blocks out of the window are the scratch
        block, which the window's mask hides (it holds finite values). k and v are
        the step's own keys and values (already in the cache); qkv the
        projections before the rotary embedding; li the layer (its
        sliding window)."""
        cfg = self.cfg
        H, K, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
        W = cfg.windows[li]
        rep = H // K
        if self.sdpa:
            return self.attend_sdpa(q, k, v, qkv, kc, vc, kv, groups, li)
        out = torch.empty(q.shape[0], H * hd, device=q.device, dtype=q.dtype)
        for g in groups:
            if g[0] == "varlen":  # gpt_oss: flash with sinks, no SDPA
                whole = self.attend_varlen(q, kc, vc, g, out, li, kv.group_of[li])
                if whole is not None:
                    return whole
            elif g[0] == "decode":
                rows = g[1]
                if self.kern is not None:
                    out[rows] = self.attend_decode_kern(qkv, kc, vc, kv, g, li)
                    continue
                B = rows.shape[0]
                kk, vv, mask = self.decode_kv(kc, vc, kv, g, li, q.dtype)
                qd = q[rows].view(B, K, rep, 1, hd)
                s = self.scores(qd, kk.unsqueeze(2).transpose(-1, -2)) + mask
                o = torch.matmul(self.probs(s, li).to(q.dtype), vv.unsqueeze(2))
                out[rows] = o.reshape(B, H * hd)
            else:
                _, a, b, trow, p, blocks = g
                blocks = blocks[kv.group_of[li]]
                T, L = b - a, p + b - a
                qc = q[a:b].transpose(0, 1).reshape(K, rep, T, hd)
                ks, vs = self.kvq.scales[li]
                kk = self.chunk_kv(kc, blocks, L, ks).unsqueeze(1)  # [K, 1, L, hd]
                vv = self.chunk_kv(vc, blocks, L, vs).unsqueeze(1)
                s = self.scores(qc, kk.transpose(-1, -2))
                s = s.masked_fill(~_allowed(T, L, p, W, q.device), float("-inf"))
                o = torch.matmul(self.probs(s, li).to(q.dtype), vv)
                out[a:b] = o.reshape(H, T, hd).transpose(0, 1).reshape(T, H * hd)
        return out

    def probs(self, s, li):
        """The attention weights of scores s [..., kv_heads, heads per kv
        head, queries, keys] in float32: their softmax, with layer li's
        sinks as one more column where it has them (gpt_oss)."""
        sinks = self.layers[li].get("sinks")
        if sinks is None:
            return torch.softmax(s.float(), dim=-1)
        K = self.cfg.kv_heads
        return gptoss.softmax_sinks(s, sinks.view(K, -1, 1, 1))

    def decode_kv(self, kc, vc, kv, g, li, dtype):
        """A decode group's keys and values gathered through layer li's
        block table, [B, kv_heads, W, head_dim], and the mask of each
        sequence's length (and the layer's window), [B, 1, 1, 1, W]."""
        _, _, trows, maxlen, lens = g
        ks, vs = self.kvq.scales[li]
        kk = self.gather(kc, kv.table_of(li), trows, maxlen, ks)
        vv = self.gather(vc, kv.table_of(li), trows, maxlen, vs)
        return kk, vv, self.decode_mask(lens, kk.shape[2], dtype, self.cfg.windows[li])

    def attend_decode_kern(self, qkv, kc, vc, kv, g, li):
        """A decode group through the Triton kernel: rotary embedding,
        KV write (again, same values) and attention over the blocks."""
        _, rows, trows, _, lens = g
        cfg = self.cfg
        cos, sin = self.tabs[self.tab_of[li]]
        return self.kern.decode_attention(qkv[rows].contiguous(), kc, vc, kv.table_of(li), trows, lens - 1, cos, sin,
                                          cfg.heads, cfg.kv_heads, cfg.context, cfg.scale, cfg.windows[li], cfg.rot_dim,
                                          self.prefetch, *self.kvq.scales[li], sinks=self.layers[li].get("sinks"))

    def attend_varlen(self, q, kc, vc, g, out, li, group):
        """A varlen group: ("varlen", qrows, krows, cu_q, cu_k, max_q,
        max_k) for every prompt chunk of the step: the chunks' packed rows
        (None: all rows, in order), per block group the rows of the
        flattened KV cache holding each chunk's prefix and itself (out of
        a sliding window: the scratch block's, outside the flash window),
        and their cumulative lengths (int32). Returns the output when it
        is the whole step. Layer li's sinks (gpt_oss) rescale flash's
        output by its log-sum-exp (gptoss.with_sinks)."""
        _, qrows, krows, cu_q, cu_k, max_q, max_k = g
        krows = krows[group]
        K, hd = self.cfg.kv_heads, self.cfg.head_dim
        qq = q if qrows is None else q[qrows]
        ks, vs = self.kvq.scales[li]
        kk = self.kvq.load(kc.view(-1, K, hd), krows, ks)
        vv = self.kvq.load(vc.view(-1, K, hd), krows, vs)
        sinks = self.layers[li].get("sinks")
        args = (qq, kk, vv, cu_q, cu_k, max_q, max_k, self.custom_scale(), self.cfg.windows[li])
        if sinks is None:
            o = _flash_varlen(*args)
        else:
            o = gptoss.with_sinks(*_flash_varlen(*args, lse=True), sinks)
        o = o.reshape(o.shape[0], -1)
        if qrows is None:
            return o
        out[qrows] = o
        return None

    def custom_scale(self):
        """The attention scale when it is not 1/sqrt(head_dim) (Gemma's
        query_pre_attn_scalar), else None: the kernels' default."""
        return None if self.cfg.scale == self.cfg.head_dim ** -0.5 else self.cfg.scale

    def attend_sdpa(self, q, k, v, qkv, kc, vc, kv, groups, li):
        """attend with F.scaled_dot_product_attention (torch 2.5+, CUDA).
        Chunks that start a sequence (position 0) need no cache: those of
        one length run as one causal batch on the step's own k and v.
        One-token sequences use the Triton decode kernel when it runs. A
        sliding layer whose window a chunk outgrows passes an explicit
        mask (SDPA's causal flags know no window)."""
        H, hd = self.cfg.heads, self.cfg.head_dim
        W = self.cfg.windows[li]
        sc = self.custom_scale()
        kw = {} if sc is None else {"scale": sc}
        out = torch.empty(q.shape[0], H * hd, device=q.device, dtype=q.dtype)
        for g in groups:
            if g[0] == "varlen":
                whole = self.attend_varlen(q, kc, vc, g, out, li, kv.group_of[li])
                if whole is not None:
                    return whole
        fresh = {}
        for g in groups:
            if g[0] == "chunk" and g[4] == 0:
                fresh.setdefault(g[2] - g[1], []).append(g[1])
        if fresh:  # they attend over the step's own keys and values: as a read of the pool gives them
            ks, vs = self.kvq.scales[li]
            k, v = self.kvq.rounded(k, ks), self.kvq.rounded(v, vs)
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
            if W and T > W:
                o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=_allowed(T, T, 0, W, q.device), **kw)
            else:
                o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, **kw)
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
                rows = g[1]
                if self.kern is not None:
                    out[rows] = self.attend_decode_kern(qkv, kc, vc, kv, g, li)
                    continue
                B = rows.shape[0]
                kk, vv, mask = self.decode_kv(kc, vc, kv, g, li, q.dtype)
                width = kk.shape[2]
                o = F.scaled_dot_product_attention(q[rows].unsqueeze(2), kk, vv, attn_mask=mask.view(B, 1, 1, width),
                                                   enable_gqa=True, **kw)
                out[rows] = o.reshape(B, H * hd)
            else:
                _, a, b, trow, p, blocks = g
                blocks = blocks[kv.group_of[li]]
                T, L = b - a, p + b - a
                ks, vs = self.kvq.scales[li]
                kk = self.chunk_kv(kc, blocks, L, ks).unsqueeze(0)  # [1, K, L, hd]
                vv = self.chunk_kv(vc, blocks, L, vs).unsqueeze(0)
                qq = q[a:b].transpose(0, 1).unsqueeze(0)
                if causal_lower_right is not None and not (W and L > W):
                    # A chunk after its sequence's first: queries are the last
                    # T of L positions. The lower-right causal bias keeps the
                    # flash kernel (an explicit mask with GQA falls back to
                    # the math kernel, milliseconds per layer); heads expanded
                    # as for fresh chunks.
                    K = kk.shape[1]
                    kk, vv = (t.unsqueeze(2).expand(1, K, H // K, L, hd).reshape(1, H, L, hd) for t in (kk, vv))
                    o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=causal_lower_right(T, L), **kw)
                else:
                    o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=_allowed(T, L, p, W, q.device), enable_gqa=True, **kw)
                out[a:b] = o[0].transpose(0, 1).reshape(T, H * hd)
        return out


def _allowed(T, L, p, W, device):
    """[T, L] bool: query i (position p + i) sees key j iff j <= p + i and,
    in a sliding layer of window W, j > p + i - W."""
    i = torch.arange(T, device=device).unsqueeze(1) + p
    j = torch.arange(L, device=device).unsqueeze(0)
    ok = j <= i
    if W:
        ok = ok & (j > i - W)
    return ok


def _kernels(cfg, device, dtype, kv_dtype):
    """The Triton kernels module when it covers the model's shapes and
    its kernels build and run here (kernels.probe, with the model's
    attention scale, rotated dims, window, norm, KV storage dtype and
    sinks); None otherwise (the torch code runs)."""
    try:
        from . import kernels
        if not kernels.usable(cfg, dtype):
            return None
        kernels.probe(device, dtype, cfg.heads, cfg.kv_heads, cfg.head_dim, rot=cfg.rot_dim, scale=cfg.scale,
                      window=max(cfg.windows), norm=cfg.family.norm, kv_dtype=kv_dtype, sinks=cfg.family.sinks,
                      qk_norm=cfg.family.qk_norm == "head", moe_k=cfg.top_k if cfg.experts else 0)
    except Exception as e:  # no Triton, or it cannot compile for this device
        log.warning("Triton kernels unavailable, using plain torch: %s", e)
        return None
    return kernels


def _flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale=None, window=0, lse=False):
    """Causal flash attention over packed variable-length sequences:
    q [Tq, H, hd], k and v [Tk, K, hd] (K divides H), cu_q and cu_k the
    int32 cumulative lengths. A sequence's queries are the last of its
    keys (the causal mask aligned bottom-right, as flash aligns it).
    scale: of q.k (None: 1/sqrt(hd)); window: a sliding window (query at
    position i sees keys i - window < j <= i; 0: every key). lse: return
    (output, each query's log-sum-exp of its scaled scores over the keys
    it sees, [Tq, H] float32, natural log), for gptoss.with_sinks."""
    kw = {}
    if scale is not None or window:
        kw["scale"] = scale
    if window:
        kw.update(window_size_left=window - 1, window_size_right=0)
    r = torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False, **kw)
    if not lse:
        return r[0]
    # The varlen kernel's log-sum-exp is unpadded, [H, Tq] (flash-attn
    # 2.5+, torch 2.4+; one-token queries too, whose heads it regroups);
    # an older layout is refused (_varlen_ok then turns the call off).
    if tuple(r[1].shape) != (q.shape[1], q.shape[0]):
        raise RuntimeError("flash attention's log-sum-exp is %s, want [heads %d, queries %d]"
                           % (list(r[1].shape), q.shape[1], q.shape[0]))
    return r[0], r[1].t()


def _varlen_ok(device, dtype, cfg):
    """Whether the varlen flash call runs here and agrees with plain
    attention on a fresh chunk and on one continuing its prefix (bf16/fp16
    only), with the model's scale, and with a window of 4 when the model
    has sliding layers; with sinks (gpt_oss), through gptoss.with_sinks,
    and on one-token chunks too (flash regroups their heads)."""
    if dtype not in (torch.bfloat16, torch.float16):
        return False
    H, hd = cfg.heads, cfg.head_dim
    scale = None if cfg.scale == hd ** -0.5 else cfg.scale
    g = torch.Generator(device="cpu").manual_seed(0)
    sinks = torch.randn(H, generator=g) if cfg.family.sinks else None
    cases = [[(5, 5), (3, 11)]]  # (queries, keys): fresh, then continuing
    if sinks is not None:
        cases.append([(1, 1), (1, 9)])
    try:
        for lens in cases:
            for window in sorted({0, 4 if any(cfg.windows) else 0}):
                err = _varlen_error(device, dtype, cfg, g, lens, scale, window, sinks)
                if err > 0.05:
                    log.warning("varlen flash attention disagrees with plain attention (window %d, by %.3g); "
                                "chunks attend one by one", window, err)
                    return False
        return True
    except (RuntimeError, TypeError, AttributeError, ImportError) as e:
        log.warning("varlen flash attention unavailable (%s); chunks attend one by one", e)
        return False


def _varlen_error(device, dtype, cfg, g, lens, scale, window, sinks):
    """The largest difference between _flash_varlen (rescaled by sinks
    [H] where given) and float32 attention on random sequences of lens
    (queries, keys), each a sequence's last queries."""
    H, K, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
    qs = [torch.randn(t, H, hd, generator=g) for t, _ in lens]
    ks = [torch.randn(n, K, hd, generator=g) for _, n in lens]
    vs = [torch.randn(n, K, hd, generator=g) for _, n in lens]
    cu = lambda xs: torch.tensor([0] + [sum(xs[: i + 1]) for i in range(len(xs))], dtype=torch.int32, device=device)
    dv = lambda xs: torch.cat(xs).to(device=device, dtype=dtype)
    args = (dv(qs), dv(ks), dv(vs), cu([t for t, _ in lens]), cu([n for _, n in lens]), max(t for t, _ in lens),
            max(n for _, n in lens), scale, window)
    if sinks is None:
        got = _flash_varlen(*args)
    else:
        got = gptoss.with_sinks(*_flash_varlen(*args, lse=True), sinks.to(device))
    got, at, err = got.float().cpu(), 0, 0.0
    for (t, n), qq, kk, vv in zip(lens, qs, ks, vs):
        kk, vv = (x.repeat_interleave(H // K, dim=1).transpose(0, 1) for x in (kk, vv))  # [H, n, hd]
        s = torch.matmul(qq.to(dtype).float().transpose(0, 1), kk.to(dtype).float().transpose(1, 2))
        s = (s * (scale or hd ** -0.5)).masked_fill(~_allowed(t, n, n - t, window, "cpu"), float("-inf"))
        p = torch.softmax(s, -1) if sinks is None else gptoss.softmax_sinks(s, sinks.view(H, 1, 1))
        want = torch.matmul(p, vv.to(dtype).float()).transpose(0, 1)
        err = max(err, (got[at : at + t] - want).abs().max().item())
        at += t
    return err


def _sdpa_gqa():
    """Whether this torch has scaled_dot_product_attention with GQA."""
    if not hasattr(F, "scaled_dot_product_attention"):
        return False
    try:
        F.scaled_dot_product_attention(torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4), enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False

"""A plain forward pass of every supported family, written apart from the
engines: no KV cache, no packing, the whole sequence recomputed for every
token, float64 throughout, each family's rules spelled out as transformers'
modeling code has them. Reads a checkpoint directory and prompts (JSON on
stdin: {"prompts": [[ids]], "n": k}) and prints, per prompt, the greedy
continuation, each chosen token's log-probability and the gap between the
top two log-probabilities. With {"weights": [names]} it prints those
weights instead, dequantized where the checkpoint is quantized.

With {"embed": [[ids]], "pool": "mean" | "cls" | "lasttoken"} it prints
each input's pooled vector instead: the last hidden state (after the final
norm, as transformers' last_hidden_state) averaged over the input, or its
first or last row. Encoders (bert, modernbert) attend both ways."""
import json
import math
import struct
import sys

import torch

GEMMA = ("gemma2", "gemma3_text")
QK_NORM = ("qwen3", "qwen3_moe", "gemma3_text")  # per head, before RoPE


def e4m3_table():
    """The value of every float8 e4m3fn byte (bias 7, no infinities, 0x7f
    and 0xff NaN)."""
    out = []
    for b in range(256):
        e, m = (b >> 3) & 15, b & 7
        v = float("nan") if b & 0x7F == 0x7F else (m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
        out.append(-v if b & 0x80 else v)
    return torch.tensor(out, dtype=torch.float64)


def load(path):
    with open(path + "/model.safetensors", "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8 : 8 + n])
    hdr.pop("__metadata__", None)
    out = {}
    for name, e in hdr.items():
        b, end = e["data_offsets"]
        chunk = bytearray(raw[8 + n + b : 8 + n + end])
        if e["dtype"] == "F32":
            t = torch.frombuffer(chunk, dtype=torch.float32)
        elif e["dtype"] == "F8_E4M3":
            t = e4m3_table()[torch.frombuffer(chunk, dtype=torch.uint8).long()]
        elif e["dtype"] == "I32":
            out[name] = torch.frombuffer(chunk, dtype=torch.int32).reshape(e["shape"]).long() & 0xFFFFFFFF
            continue
        elif e["dtype"] == "U8":
            out[name] = torch.frombuffer(chunk, dtype=torch.uint8).reshape(e["shape"]).long()
            continue
        elif e["dtype"] == "I64":
            out[name] = torch.frombuffer(chunk, dtype=torch.int64).reshape(e["shape"])
            continue
        elif e["dtype"] == "BF16":
            t = torch.frombuffer(chunk, dtype=torch.int16).view(torch.bfloat16)
        else:
            t = torch.frombuffer(chunk, dtype=torch.float16)
        out[name] = t.reshape(e["shape"]).double()
    return out


# The FP4 (E2M1) value of each code: bit 3 the sign, then 2 exponent bits
# and 1 mantissa bit.
FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4(blocks, scales):
    """gpt_oss's MXFP4 expert tensor from its _blocks [E, rows, G, 16]
    (bytes: the low nibble is value 2j of the block, the high one 2j + 1)
    and _scales [E, rows, G] (E8M0: 2^(byte - 127) for each block of 32):
    [E, G * 32, rows], the [E, in, out] layout gate_up_proj and down_proj
    have in the dequantized checkpoints."""
    lut = torch.tensor(FP4, dtype=torch.float64)
    vals = torch.stack([lut[blocks & 15], lut[blocks >> 4]], dim=-1).flatten(-2)  # [E, rows, G, 32]
    vals = vals * torch.pow(2.0, (scales - 127).double()).unsqueeze(-1)
    E, rows = blocks.shape[0], blocks.shape[1]
    return vals.reshape(E, rows, -1).transpose(1, 2).contiguous()


def nibbles(packed, order):
    """[..., n] 32-bit words to [..., 8n] 4-bit values: value 8c + j of a
    row is nibble order[j] of word c."""
    shifts = torch.tensor([4 * i for i in order], dtype=torch.long)
    return ((packed.unsqueeze(-1) >> shifts) & 15).flatten(-2)


def dequantize(w, q):
    """w with every quantized linear weight replaced by its float value
    (name.weight), from the layout's tensors: fp8 with weight_scale_inv
    blocks (quant_method fp8), fp8 with weight_scale per channel or per
    tensor (compressed-tensors float-quantized), AWQ's GEMM packing,
    GPTQ's (v1 zeros: stored zero + 1; checkpoint_format gptq_v2: the
    stored zero; each input in its g_idx group, act order's included) or
    compressed-tensors pack-quantized int4 (weight_packed holding q + 8,
    weight_scale per group, weight_zero_point packed along the output
    holding zp + 8, or zero when symmetric; w = (q - zp) * scale) or
    gpt_oss's MXFP4 experts (name_blocks and name_scales, see mxfp4)."""
    method = (q or {}).get("quant_method")
    out = {}
    for name, t in w.items():
        if name.endswith("_blocks"):  # quant_method mxfp4 (gpt_oss's experts)
            base = name[: -len("_blocks")]
            out[base] = mxfp4(t, w[base + "_scales"])
        elif name.endswith("_scales") and name[: -len("_scales")] + "_blocks" in w:
            continue
        elif name.endswith(".weight_packed"):
            base = name[: -len("_packed")]
            rows, cols = (int(x) for x in w[base + "_shape"].tolist())
            iw = nibbles(t, range(8))[:, :cols] - 8  # [out, in], signed
            scale = w[base + "_scale"]  # [out, in / group]
            grp = torch.arange(cols) // (cols // scale.shape[1])
            if base + "_g_idx" in w:
                grp = w[base + "_g_idx"]
            zp = torch.zeros_like(scale)
            if base + "_zero_point" in w:
                zp = nibbles(w[base + "_zero_point"].transpose(0, 1), range(8)).transpose(0, 1)[:rows] - 8
            out[base] = (iw - zp[:, grp]) * scale[:, grp]
        elif name.endswith(".weight_scale_inv"):
            base = name[: -len("_scale_inv")]
            bo, bi = q["weight_block_size"]
            wt = w[base]
            s = t.repeat_interleave(bo, 0)[: wt.shape[0]].repeat_interleave(bi, 1)[:, : wt.shape[1]]
            out[base] = wt * s
        elif name.endswith(".weight_scale") and name[: -len("_scale")] + "_packed" not in w:
            base = name[: -len("_scale")]
            out[base] = w[base] * (t.reshape(-1, 1) if t.numel() > 1 else t.reshape(()))
        elif name.endswith(".qweight"):
            base = name[: -len("qweight")]
            scales, g = w[base + "scales"], q["group_size"]
            if method == "awq":
                iw = nibbles(t, [0, 4, 1, 5, 2, 6, 3, 7])  # [in, out]
                z = nibbles(w[base + "qzeros"], [0, 4, 1, 5, 2, 6, 3, 7])
            else:
                iw = nibbles(t.transpose(0, 1), range(8)).transpose(0, 1)  # [in, out]
                z = nibbles(w[base + "qzeros"], range(8)) + (0 if q.get("checkpoint_format") == "gptq_v2" else 1)
            grp = torch.arange(iw.shape[0]) // g
            if base + "g_idx" in w:  # each input's group (GPTQ)
                grp = w[base + "g_idx"]
            out[base + "weight"] = ((iw - z[grp]) * scales[grp]).transpose(0, 1).contiguous()
        elif name.endswith((".qzeros", ".scales", ".g_idx", ".weight_scale", ".weight_shape", ".weight_zero_point", ".weight_g_idx")) or name in out:
            continue
        elif name not in out:
            out[name] = t
    return out


def text_weights(w):
    """The language model's weights under model.-relative names (a gemma3
    checkpoint keeps them under language_model.model. or, from newer
    transformers, model.language_model.), and its output head."""
    for prefix in ("language_model.model.", "model.language_model.", "model.", ""):
        if prefix + "embed_tokens.weight" in w:
            break
    tw = {"model." + k[len(prefix) :]: v for k, v in w.items() if k.startswith(prefix)}
    head = w.get("lm_head.weight", w.get("language_model.lm_head.weight"))
    tw["lm_head.weight"] = head if head is not None else tw["model.embed_tokens.weight"]
    return tw


def inv_freq(c, theta, scaling, d, T):
    """Rotary frequencies of a d-wide rotation, and the factor cos and sin
    are scaled by (longrope's and yarn's attention factor, else 1)."""
    inv = [1.0 / (theta ** (2 * i / d)) for i in range(d // 2)]
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    if kind == "linear":
        inv = [x / scaling["factor"] for x in inv]
    elif kind == "llama3":
        f, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        res = []
        for x in inv:
            wl = 2 * math.pi / x
            if wl < old / hi:
                res.append(x)
            elif wl > old / lo:
                res.append(x / f)
            else:
                s = (old / wl - lo) / (hi - lo)
                res.append((1 - s) * x / f + s * x)
        inv = res
    elif kind == "longrope":
        # transformers: the long factors once the sequence is longer than
        # the original context (here the whole sequence, recomputed).
        old = c.get("original_max_position_embeddings") or scaling["original_max_position_embeddings"]
        factors = scaling["long_factor"] if T > old else scaling["short_factor"]
        inv = [x / f for x, f in zip(inv, factors)]
        grow = c["max_position_embeddings"] / old
        att = scaling.get("attention_factor") or (1.0 if grow <= 1 else math.sqrt(1 + math.log(grow) / math.log(old)))
        return torch.tensor(inv, dtype=torch.float64), att
    elif kind == "yarn":
        return yarn(c, theta, scaling, d)
    elif kind != "default":
        raise SystemExit("reference: rope scaling %r" % kind)
    return torch.tensor(inv, dtype=torch.float64), 1.0


def yarn(c, theta, s, d):
    """YaRN (arXiv 2309.00071) as transformers has it: frequency i keeps
    its own value (extrapolates) while it turns more than beta_fast times
    over the original context, takes value / factor (interpolates) below
    beta_slow turns, and blends the two linearly by index in between; cos
    and sin are scaled by the attention factor."""
    f = s["factor"]
    old = s.get("original_max_position_embeddings") or c["max_position_embeddings"]
    fast, slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def mscale(m):
        return 1.0 if f <= 1 else 0.1 * m * math.log(f) + 1.0

    att = s.get("attention_factor")
    if att is None:
        m, mall = s.get("mscale"), s.get("mscale_all_dim")
        att = mscale(m) / mscale(mall) if m and mall else mscale(1)

    def turns_dim(turns):  # the index i at which frequency i turns `turns` times in old positions
        return d * math.log(old / (turns * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = turns_dim(fast), turns_dim(slow)
    if s.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    if hi == lo:
        hi += 0.001
    inv = []
    for i in range(d // 2):
        x = 1.0 / (theta ** (2 * i / d))
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)  # 0: extrapolate, 1: interpolate
        inv.append(ramp * x / f + (1 - ramp) * x)
    return torch.tensor(inv, dtype=torch.float64), att


def sliding_layers(c, arch):
    """The set of layers that attend through a sliding window."""
    n, W = c["num_hidden_layers"], c.get("sliding_window")
    if not W:
        return set()
    if c.get("layer_types"):
        return {i for i, t in enumerate(c["layer_types"]) if t == "sliding_attention"}
    if arch == "gemma3_text":
        return {i for i in range(n) if (i + 1) % c.get("sliding_window_pattern", 6)}
    if arch == "gemma2":
        return {i for i in range(n) if i % 2 == 0}
    if arch in ("qwen2", "qwen3", "qwen3_moe"):
        return set(range(c.get("max_window_layers", n), n)) if c.get("use_sliding_window") else set()
    return set(range(n))


def hidden(w, c, ids):
    """The decoder's last hidden state, [T, hidden], after the final norm."""
    arch = c["model_type"]
    H, K = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or c["hidden_size"] // H
    rd = int(d * c.get("partial_rotary_factor", 1.0))
    eps = c["rms_norm_eps"]
    T = len(ids)
    gemma = arch in GEMMA
    slide = sliding_layers(c, arch)

    def rotary(theta, scaling):
        inv, att = inv_freq(c, theta, scaling, rd, T)
        ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
        return ang.cos() * att, ang.sin() * att

    rot_global = rotary(c["rope_theta"], c.get("rope_scaling"))
    rot_local = rotary(c.get("rope_local_base_freq", 10000.0), None) if arch == "gemma3_text" else rot_global

    def rope(x, cs):  # x [heads, T, d]; pairs (i, i + rd/2) of the first rd dims
        cos, sin = cs
        a, b, rest = x[..., : rd // 2], x[..., rd // 2 : rd], x[..., rd:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin, rest], dim=-1)

    def norm(x, g):
        y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
        return y * (1 + g) if gemma else g * y

    def act(g):
        if gemma:  # gelu, tanh approximation
            return 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
        return g * torch.sigmoid(g)

    def dense(h, p):
        if p + "gate_up_proj.weight" in w:
            g, u = (h @ w[p + "gate_up_proj.weight"].T).chunk(2, dim=-1)
        else:
            g, u = h @ w[p + "gate_proj.weight"].T, h @ w[p + "up_proj.weight"].T
        return (act(g) * u) @ w[p + "down_proj.weight"].T

    def experts(h, p, names, renorm):
        probs = torch.softmax(h @ w[p + "gate.weight"].T, -1)
        top, idx = torch.topk(probs, c["num_experts_per_tok"], dim=-1)
        if renorm:
            top = top / top.sum(-1, keepdim=True)
        out = torch.zeros_like(h)
        for t in range(h.shape[0]):
            for s in range(top.shape[1]):
                e = "%sexperts.%d." % (p, int(idx[t, s]))
                g = h[t] @ w[e + names[0]].T
                u = h[t] @ w[e + names[1]].T
                out[t] += top[t, s] * ((g * torch.sigmoid(g) * u) @ w[e + names[2]].T)
        return out

    def gpt_oss_experts(h, p):
        """GptOssMLP: top-k of the router's logits (with its bias),
        softmax over those k; each chosen expert's gate and up are the
        even and odd columns of gate_up_proj (plus bias), gate clamped
        to at most swiglu_limit and up to +-swiglu_limit, out = ((up + 1)
        * gate * sigmoid(1.702 gate)) @ down_proj + its bias."""
        limit = c.get("swiglu_limit", 7.0)
        logits = h @ w[p + "router.weight"].T + w[p + "router.bias"]
        top, idx = torch.topk(logits, c["num_experts_per_tok"], dim=-1)
        top = torch.softmax(top, -1)
        e = p + "experts."
        out = torch.zeros_like(h)
        for t in range(h.shape[0]):
            for s in range(top.shape[1]):
                j = int(idx[t, s])
                gu = h[t] @ w[e + "gate_up_proj"][j] + w[e + "gate_up_proj_bias"][j]
                g, u = gu[::2].clamp(max=limit), gu[1::2].clamp(-limit, limit)
                y = ((u + 1) * (g * torch.sigmoid(1.702 * g))) @ w[e + "down_proj"][j] + w[e + "down_proj_bias"][j]
                out[t] += top[t, s] * y
        return out

    def mlp(h, p, i):
        if arch == "gpt_oss":
            return gpt_oss_experts(h, p + "mlp.")
        if arch == "mixtral":
            return experts(h, p + "block_sparse_moe.", ("w1.weight", "w3.weight", "w2.weight"), True)
        if arch == "qwen3_moe" and i not in c.get("mlp_only_layers", []) and (i + 1) % c.get("decoder_sparse_step", 1) == 0:
            names = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")
            return experts(h, p + "mlp.", names, c.get("norm_topk_prob", False))
        return dense(h, p + "mlp.")

    def attention(h, p, i):
        a = p + "self_attn."
        if a + "qkv_proj.weight" in w:
            qkv = h @ w[a + "qkv_proj.weight"].T
            proj = dict(zip("qkv", torch.split(qkv, [H * d, K * d, K * d], dim=-1)))
        else:
            proj = {}
            for n in "qkv":
                y = h @ w[a + "%s_proj.weight" % n].T
                if a + "%s_proj.bias" % n in w:
                    y = y + w[a + "%s_proj.bias" % n]
                proj[n] = y
        if arch == "olmo2":  # over the whole projection, before the heads
            proj["q"] = norm(proj["q"], w[a + "q_norm.weight"])
            proj["k"] = norm(proj["k"], w[a + "k_norm.weight"])
        q, k, v = (proj[n].reshape(T, -1, d).transpose(0, 1) for n in "qkv")
        if arch in QK_NORM:
            q, k = norm(q, w[a + "q_norm.weight"]), norm(k, w[a + "k_norm.weight"])
        cs = rot_local if i in slide else rot_global
        q, k = rope(q, cs), rope(k, cs)
        scale = c["query_pre_attn_scalar"] ** -0.5 if gemma else 1 / math.sqrt(d)
        qi = torch.arange(T).unsqueeze(1)
        kj = torch.arange(T).unsqueeze(0)
        allowed = kj <= qi
        if i in slide:
            allowed = allowed & (kj > qi - c["sliding_window"])
        cap = c.get("attn_logit_softcapping")
        heads = []
        for hq in range(H):
            hk = hq // (H // K)
            s = q[hq] @ k[hk].T * scale
            if cap:
                s = torch.tanh(s / cap) * cap
            s = s.masked_fill(~allowed, float("-inf"))
            if a + "sinks" in w:  # gpt_oss: a learned logit column each row's softmax includes, then drops
                sink = w[a + "sinks"][hq].expand(T, 1)
                p_ = torch.softmax(torch.cat([s, sink], -1), -1)[:, :-1]
            else:
                p_ = torch.softmax(s, -1)
            heads.append(p_ @ v[hk])
        o = torch.cat(heads, -1) @ w[a + "o_proj.weight"].T
        return o + w[a + "o_proj.bias"] if a + "o_proj.bias" in w else o

    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    if gemma:
        x = x * math.sqrt(c["hidden_size"])
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        if gemma:
            x = x + norm(attention(norm(x, w[p + "input_layernorm.weight"]), p, i), w[p + "post_attention_layernorm.weight"])
            x = x + norm(mlp(norm(x, w[p + "pre_feedforward_layernorm.weight"]), p, i), w[p + "post_feedforward_layernorm.weight"])
        elif arch == "olmo2":
            x = x + norm(attention(x, p, i), w[p + "post_attention_layernorm.weight"])
            x = x + norm(mlp(x, p, i), w[p + "post_feedforward_layernorm.weight"])
        else:
            x = x + attention(norm(x, w[p + "input_layernorm.weight"]), p, i)
            x = x + mlp(norm(x, w[p + "post_attention_layernorm.weight"]), p, i)
    return norm(x, w["model.norm.weight"])


def forward(w, c, ids):
    x = hidden(w, c, ids)[-1]
    logits = x @ w["lm_head.weight"].T
    cap = c.get("final_logit_softcapping")
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    y = (x - mu) / torch.sqrt(var + eps) * w
    return y + b if b is not None else y


def gelu(x):  # exact, erf
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def bidirectional(q, k, v, allowed):
    """Attention of every head over every allowed position; q, k, v are
    [heads, T, d], allowed a [T, T] bool mask."""
    s = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~allowed, float("-inf"))
    return (torch.softmax(s, -1) @ v).transpose(0, 1).reshape(q.shape[1], -1)


def encoder_weights(w, prefix):
    """An encoder's weights under bare names (BertModel, ModernBertModel),
    from those or from a masked-LM checkpoint's prefixed ones."""
    if any(k.startswith(prefix) for k in w):
        return {k[len(prefix) :]: v for k, v in w.items() if k.startswith(prefix)}
    return w


def bert_hidden(w, c, ids):
    """BertModel's last_hidden_state: embeddings (token type 0) and
    post-norm layers."""
    w = encoder_weights(w, "bert.")
    T, H, eps = len(ids), c["num_attention_heads"], c["layer_norm_eps"]

    def ln(x, n):
        return layer_norm(x, w[n + ".weight"], w[n + ".bias"], eps)

    def lin(x, n):
        return x @ w[n + ".weight"].T + w[n + ".bias"]

    e = "embeddings."
    x = w[e + "word_embeddings.weight"][torch.tensor(ids)] + w[e + "position_embeddings.weight"][:T] + w[e + "token_type_embeddings.weight"][0]
    x = ln(x, e + "LayerNorm")
    everywhere = torch.ones(T, T, dtype=torch.bool)
    for i in range(c["num_hidden_layers"]):
        p = "encoder.layer.%d." % i
        q, k, v = (lin(x, p + "attention.self." + n).reshape(T, H, -1).transpose(0, 1) for n in ("query", "key", "value"))
        a = lin(bidirectional(q, k, v, everywhere), p + "attention.output.dense")
        x = ln(a + x, p + "attention.output.LayerNorm")
        m = lin(gelu(lin(x, p + "intermediate.dense")), p + "output.dense")
        x = ln(m + x, p + "output.LayerNorm")
    return x


def modernbert_hidden(w, c, ids):
    """ModernBertModel's last_hidden_state: a normed token embedding,
    pre-norm layers (none before layer 0's attention) with rotary
    attention, global on layers i % global_attn_every_n_layers == 0 and
    within local_attention/2 positions either side elsewhere, a GeGLU MLP,
    the final norm."""
    w = encoder_weights(w, "model.")
    T, H, h = len(ids), c["num_attention_heads"], c["hidden_size"]
    d, eps = h // H, c["norm_eps"]
    types = c.get("layer_types") or [
        "full_attention" if i % c["global_attn_every_n_layers"] == 0 else "sliding_attention" for i in range(c["num_hidden_layers"])
    ]
    rp = c.get("rope_parameters") or {}
    theta = {
        "full_attention": (rp.get("full_attention") or {}).get("rope_theta", c.get("global_rope_theta")),
        "sliding_attention": (rp.get("sliding_attention") or {}).get("rope_theta", c.get("local_rope_theta")),
    }

    def ln(x, n):
        return layer_norm(x, w[n + ".weight"], w.get(n + ".bias"), eps)

    def rope(x, base):  # rotate_half over the whole head
        inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
        cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
        rot = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
        return x * cos + rot * sin

    qi, kj = torch.arange(T).unsqueeze(1), torch.arange(T).unsqueeze(0)
    x = ln(w["embeddings.tok_embeddings.weight"][torch.tensor(ids)], "embeddings.norm")
    for i, kind in enumerate(types):
        p = "layers.%d." % i
        y = ln(x, p + "attn_norm") if i > 0 else x
        q, k, v = (y @ w[p + "attn.Wqkv.weight"].T).reshape(T, 3, H, d).permute(1, 2, 0, 3)
        q, k = rope(q, theta[kind]), rope(k, theta[kind])
        allowed = torch.ones(T, T, dtype=torch.bool)
        if kind == "sliding_attention":
            allowed = (qi - kj).abs() <= c["local_attention"] // 2
        x = x + bidirectional(q, k, v, allowed) @ w[p + "attn.Wo.weight"].T
        inp, gate = (ln(x, p + "mlp_norm") @ w[p + "mlp.Wi.weight"].T).chunk(2, dim=-1)
        x = x + (gelu(inp) * gate) @ w[p + "mlp.Wo.weight"].T
    return ln(x, "final_norm")


def pool(x, mode):
    if mode == "mean":
        return x.mean(0)
    if mode == "cls":
        return x[0]
    if mode == "lasttoken":
        return x[-1]
    raise SystemExit("reference: pooling %r" % mode)


def main():
    path = sys.argv[1]
    with open(path + "/config.json") as f:
        c = json.load(f)
    q = c.get("quantization_config")
    c = c.get("text_config") or c
    raw = dequantize(load(path), q)
    req = json.load(sys.stdin)
    if "embed" in req:
        arch = c["model_type"]
        if arch == "bert":
            states = lambda ids: bert_hidden(raw, c, ids)
        elif arch == "modernbert":
            states = lambda ids: modernbert_hidden(raw, c, ids)
        else:
            w = text_weights(raw)
            states = lambda ids: hidden(w, c, ids)
        json.dump([pool(states(list(ids)), req["pool"]).tolist() for ids in req["embed"]], sys.stdout)
        return
    w = text_weights(raw)
    if "weights" in req:  # the named weights as the forward sees them, flattened
        json.dump({n: w[n].flatten().tolist() for n in req["weights"]}, sys.stdout)
        return
    out = []
    for ids in req["prompts"]:
        ids, toks, lps, gaps = list(ids), [], [], []
        for _ in range(req["n"]):
            lp = torch.log_softmax(forward(w, c, ids), -1)
            top = torch.topk(lp, 2).values
            t = int(torch.argmax(lp))
            toks.append(t)
            lps.append(float(lp[t]))
            gaps.append(float(top[0] - top[1]))
            ids.append(t)
        out.append({"tokens": toks, "logprobs": lps, "gaps": gaps})
    json.dump(out, sys.stdout)


main()

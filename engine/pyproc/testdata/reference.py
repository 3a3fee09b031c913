"""A plain Llama-family forward pass, written apart from the runtime: no KV
cache, no packing, the whole sequence recomputed for every token. Reads a
checkpoint directory and prompts (JSON on stdin: {"prompts": [[ids]], "n": k})
and prints, per prompt, the greedy continuation and each chosen token's
log-probability."""
import json
import math
import struct
import sys

import torch


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
        elif e["dtype"] == "BF16":
            t = torch.frombuffer(chunk, dtype=torch.int16).view(torch.bfloat16)
        else:
            t = torch.frombuffer(chunk, dtype=torch.float16)
        out[name] = t.reshape(e["shape"]).double()
    return out


def inv_freq(c):
    d = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    inv = [1.0 / (c["rope_theta"] ** (2 * i / d)) for i in range(d // 2)]
    rs = c.get("rope_scaling")
    if rs:
        f, lo, hi, old = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
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
    return torch.tensor(inv, dtype=torch.float64)


def forward(w, c, ids):
    H, K = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or c["hidden_size"] // H
    eps = c["rms_norm_eps"]
    T = len(ids)
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq(c))
    cos, sin = ang.cos(), ang.sin()

    def rope(x):  # x [heads, T, d]; pairs (i, i + d/2)
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def norm(x, g):
        return g * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)

    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = norm(x, w[p + "input_layernorm.weight"])
        proj = {}
        for n in "qkv":
            y = h @ w[p + "self_attn.%s_proj.weight" % n].T
            if p + "self_attn.%s_proj.bias" % n in w:
                y = y + w[p + "self_attn.%s_proj.bias" % n]
            proj[n] = y.reshape(T, -1, d).transpose(0, 1)
        q, k, v = rope(proj["q"]), rope(proj["k"]), proj["v"]
        heads = []
        for hq in range(H):
            hk = hq // (H // K)
            s = q[hq] @ k[hk].T / math.sqrt(d)
            s = s + torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), 1)
            heads.append(torch.softmax(s, -1) @ v[hk])
        x = x + torch.cat(heads, -1) @ w[p + "self_attn.o_proj.weight"].T
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (g * torch.sigmoid(g) * u) @ w[p + "mlp.down_proj.weight"].T
    x = norm(x[-1], w["model.norm.weight"])
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T


def main():
    path = sys.argv[1]
    with open(path + "/config.json") as f:
        c = json.load(f)
    w = load(path)
    req = json.load(sys.stdin)
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

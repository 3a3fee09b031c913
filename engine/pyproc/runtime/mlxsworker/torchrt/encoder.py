"""Bidirectional encoders (the BERT family), in plain torch: BertModel and
ModernBertModel, as transformers runs them, returning the last hidden
state for pooling (embeddings only: an encoder never generates).

Every token attends to every other token of its own input and to none of
another's: the inputs of a step are packed into one [N, hidden] matrix
for the projections and the MLP, and attend per input with no padding
(a varlen flash call on CUDA in half precision; elsewhere the inputs of
one length as one batch through SDPA, or the plain softmax where torch
has no SDPA). ModernBERT's local layers see local_attention/2 positions
either side. No KV is kept: an input is embedded in the step that feeds
it.
"""
import logging
import os

import torch
import torch.nn.functional as F

from ..errors import CheckpointError
from ..stcheck import read_json
from .config import ENCODERS
from .st import Checkpoint

log = logging.getLogger("encoder")

# Bounds far above any real encoder, checked before any weight is read.
LIMITS = {"hidden": 1 << 14, "layers": 1 << 8, "heads": 1 << 8, "intermediate": 1 << 16, "vocab": 1 << 20,
          "context": 1 << 17}
# Where a masked-LM checkpoint keeps the encoder (BertForMaskedLM,
# ModernBertForMaskedLM); the bare model (what sentence-transformers
# publishes) has no prefix.
PREFIXES = {"bert": "bert.", "modernbert": "model."}


def is_encoder(model_type):
    return model_type in ENCODERS


class EncoderConfig:
    """The fields of an encoder's config.json the forward pass needs.
    Anything missing, of the wrong type or inconsistent is a
    CheckpointError naming the field."""

    def __init__(self, directory):
        c = read_json(os.path.join(directory, "config.json"), "config.json")
        self.arch = c.get("model_type", "")
        if not is_encoder(self.arch):
            raise CheckpointError("config.json", "not an encoder: model_type %r" % self.arch)
        try:
            self._read(c)
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError("config.json", "missing or bad field: %s" % e)
        for field, limit in LIMITS.items():
            if getattr(self, field) > limit:
                raise CheckpointError("config.json", "%s %d is beyond any supported model (limit %d)" % (field, getattr(self, field), limit))
        self.dtype = c.get("torch_dtype") or c.get("dtype") or "float32"
        if c.get("quantization_config") is not None:
            raise CheckpointError("config.json", "quantization_config: quantized encoders are not supported")

    def _read(self, c):
        self.hidden = _int(c, "hidden_size")
        self.layers = _int(c, "num_hidden_layers")
        self.heads = _int(c, "num_attention_heads")
        self.intermediate = _int(c, "intermediate_size")
        self.vocab = _int(c, "vocab_size")
        self.context = _int(c, "max_position_embeddings")
        if self.hidden % self.heads:
            raise ValueError("hidden_size %d is not a multiple of num_attention_heads %d" % (self.hidden, self.heads))
        self.head_dim = self.hidden // self.heads
        self.bos, self.eos = -1, []
        self.windows = [0] * self.layers  # a local layer's reach either side; 0: global
        if self.arch == "bert":
            self._read_bert(c)
        else:
            self._read_modernbert(c)

    def _read_bert(self, c):
        act = c.get("hidden_act", "gelu")
        if act != "gelu":
            raise ValueError("hidden_act %r (bert: gelu only)" % act)
        pos = c.get("position_embedding_type", "absolute")
        if pos != "absolute":
            raise ValueError("position_embedding_type %r (absolute only)" % pos)
        self.eps = _eps(c, "layer_norm_eps", 1e-12)
        self.type_vocab = _int(c, "type_vocab_size", 2)

    def _read_modernbert(self, c):
        act = c.get("hidden_activation", "gelu")
        if act != "gelu":
            raise ValueError("hidden_activation %r (modernbert: gelu only)" % act)
        if c.get("attention_bias") or c.get("mlp_bias"):
            raise ValueError("attention_bias and mlp_bias must be false")
        self.eps = _eps(c, "norm_eps", 1e-5)
        self.norm_bias = bool(c.get("norm_bias", False))
        every = _int(c, "global_attn_every_n_layers", 3)
        # Transformers 5 may name the reach either side sliding_window.
        local = _int(c, "local_attention", 2 * c["sliding_window"] if isinstance(c.get("sliding_window"), int) else 128)
        types = c.get("layer_types")
        if types is None:
            types = ["full_attention" if i % every == 0 else "sliding_attention" for i in range(self.layers)]
        if not isinstance(types, list) or len(types) != self.layers:
            raise ValueError("layer_types lists %s layers, not %d" % (len(types) if isinstance(types, list) else "no", self.layers))
        unknown = sorted({str(t) for t in types} - {"sliding_attention", "full_attention"})
        if unknown:
            raise ValueError("layer_types: unsupported %s" % ", ".join(unknown))
        if local < 2:
            raise ValueError("local_attention %d: want at least 2" % local)
        self.windows = [local // 2 if t == "sliding_attention" else 0 for t in types]
        rp = c.get("rope_parameters") or {}
        if not isinstance(rp, dict):
            raise ValueError("rope_parameters is not an object")
        full = rp.get("full_attention") or {}
        slide = rp.get("sliding_attention") or {}
        self.thetas = (_theta(full.get("rope_theta", c.get("global_rope_theta", 160000.0)), "global_rope_theta"),
                       _theta(slide.get("rope_theta", c.get("local_rope_theta", 10000.0)), "local_rope_theta"))
        if self.head_dim % 2:
            raise ValueError("head size %d is odd: rotary embeddings need it even" % self.head_dim)
        self.bos = _opt_id(c.get("cls_token_id", c.get("bos_token_id")))
        sep = _opt_id(c.get("sep_token_id", c.get("eos_token_id")))
        self.eos = [sep] if sep >= 0 else []


def _int(c, k, default=None):
    v = c.get(k, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError("%s %r is not an integer" % (k, v))
    if v <= 0:
        raise ValueError("%s %d must be positive" % (k, v))
    return v


def _eps(c, k, default):
    v = c.get(k, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
        raise ValueError("%s %r: want a number in (0, 1)" % (k, v))
    return float(v)


def _theta(v, k):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 1:
        raise ValueError("%s %r: want a number above 1" % (k, v))
    return float(v)


def _opt_id(v):
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else -1


def gelu(x):
    """GELU, exact (erf), as transformers' "gelu"."""
    return F.gelu(x)


class Encoder:
    """An encoder's weights and forward pass (see the module doc)."""

    def __init__(self, directory, cfg, device, dtype, varlen=True):
        self.cfg, self.device, self.dtype = cfg, device, dtype
        ck = Checkpoint(directory)
        prefix = PREFIXES[cfg.arch]
        emb = "embeddings.word_embeddings.weight" if cfg.arch == "bert" else "embeddings.tok_embeddings.weight"
        p = "" if ck.has(emb) or not ck.has(prefix + emb) else prefix
        get = lambda n, s: ck.get(p + n, s, device, dtype)
        opt = lambda n, s: get(n, s) if ck.has(p + n) else None
        h, inter = cfg.hidden, cfg.intermediate
        self.sdpa = hasattr(F, "scaled_dot_product_attention")
        if cfg.arch == "bert":
            e = "embeddings."
            self.embed = get(e + "word_embeddings.weight", (cfg.vocab, h))
            self.pos = get(e + "position_embeddings.weight", (cfg.context, h))
            # Every input is one segment: token type 0.
            self.type0 = get(e + "token_type_embeddings.weight", (cfg.type_vocab, h))[0].clone()
            self.ln_emb = (get(e + "LayerNorm.weight", (h,)), get(e + "LayerNorm.bias", (h,)))
            self.layers = [self._bert_layer(get, "encoder.layer.%d." % i) for i in range(cfg.layers)]
        else:
            nb = lambda n: (get(n + ".weight", (h,)), opt(n + ".bias", (h,)) if cfg.norm_bias else None)
            self.embed = get("embeddings.tok_embeddings.weight", (cfg.vocab, h))
            self.ln_emb = nb("embeddings.norm")
            self.layers = []
            for i in range(cfg.layers):
                q = "layers.%d." % i
                self.layers.append({
                    "attn_norm": nb(q + "attn_norm") if i > 0 else None,  # layer 0: the embedding's norm serves
                    "qkv": get(q + "attn.Wqkv.weight", (3 * h, h)), "o": get(q + "attn.Wo.weight", (h, h)),
                    "mlp_norm": nb(q + "mlp_norm"),
                    "wi": get(q + "mlp.Wi.weight", (2 * inter, h)), "wo": get(q + "mlp.Wo.weight", (h, inter)),
                })
            self.ln_final = nb("final_norm")
            self.inv_freq = [1.0 / (t ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
                             for t in cfg.thetas]
        # varlen: inputs may attend in one varlen flash call (settings.varlen).
        self.varlen = varlen and _varlen_ok(self, device, dtype)

    def _bert_layer(self, get, p):
        h, inter = self.cfg.hidden, self.cfg.intermediate
        s = p + "attention.self."
        return {
            "qkv": torch.cat([get(s + n + ".weight", (h, h)) for n in ("query", "key", "value")]),
            "qkv_b": torch.cat([get(s + n + ".bias", (h,)) for n in ("query", "key", "value")]),
            "o": get(p + "attention.output.dense.weight", (h, h)), "o_b": get(p + "attention.output.dense.bias", (h,)),
            "ln1": (get(p + "attention.output.LayerNorm.weight", (h,)), get(p + "attention.output.LayerNorm.bias", (h,))),
            "wi": get(p + "intermediate.dense.weight", (inter, h)), "wi_b": get(p + "intermediate.dense.bias", (inter,)),
            "wo": get(p + "output.dense.weight", (h, inter)), "wo_b": get(p + "output.dense.bias", (h,)),
            "ln2": (get(p + "output.LayerNorm.weight", (h,)), get(p + "output.LayerNorm.bias", (h,))),
        }

    def tensors(self):
        """Every weight tensor, for the weight count."""
        ts = [self.embed] + [t for t in self.ln_emb if t is not None]
        if self.cfg.arch == "bert":
            ts += [self.pos, self.type0]
        else:
            ts += [t for t in self.ln_final if t is not None]
        for L in self.layers:
            for v in L.values():
                ts += [t for t in (v if isinstance(v, tuple) else (v,)) if t is not None]
        return ts

    def ln(self, x, wb):
        w, b = wb
        return F.layer_norm(x, (x.shape[-1],), w, b, self.cfg.eps)

    def forward(self, tokens, pos, lens):
        """tokens, pos: [N] packed over the inputs (pos from 0 in each);
        lens: the inputs' lengths in order (a host list). Returns the last
        hidden state [N, hidden], after the final norm (ModernBERT) or the
        last layer's (BERT)."""
        cfg = self.cfg
        plan = self._plan(lens)
        if cfg.arch == "bert":
            x = self.ln(self.embed[tokens] + self.pos[pos] + self.type0, self.ln_emb)
            for L in self.layers:
                qkv = F.linear(x, L["qkv"], L["qkv_b"])
                a = F.linear(self.attend(qkv, plan, 0), L["o"], L["o_b"])
                x = self.ln(a + x, L["ln1"])
                m = F.linear(gelu(F.linear(x, L["wi"], L["wi_b"])), L["wo"], L["wo_b"])
                x = self.ln(m + x, L["ln2"])
            return x
        tabs = [self._rope_table(inv, pos) for inv in self.inv_freq]
        x = self.ln(self.embed[tokens], self.ln_emb)
        for i, L in enumerate(self.layers):
            h = x if L["attn_norm"] is None else self.ln(x, L["attn_norm"])
            qkv = F.linear(h, L["qkv"])
            W = cfg.windows[i]
            qkv = self._rope(qkv, *tabs[1 if W else 0])
            x = x + F.linear(self.attend(qkv, plan, W), L["o"])
            inp, gate = F.linear(self.ln(x, L["mlp_norm"]), L["wi"]).chunk(2, dim=-1)
            x = x + F.linear(gelu(inp) * gate, L["wo"])
        return self.ln(x, self.ln_final)

    def _rope_table(self, inv, pos):
        ang = torch.outer(pos.double(), inv.to(pos.device))
        ang = torch.cat([ang, ang], -1)
        return ang.cos().to(self.dtype).unsqueeze(1), ang.sin().to(self.dtype).unsqueeze(1)

    def _rope(self, qkv, cos, sin):
        """q and k of the packed [N, 3 * hidden] projections rotated
        (rotate_half over the whole head); v as it is."""
        H, hd = self.cfg.heads, self.cfg.head_dim
        n = qkv.shape[0]
        qk = qkv[:, : 2 * H * hd].reshape(n, 2 * H, hd)
        half = hd // 2
        rot = torch.cat([-qk[..., half:], qk[..., :half]], dim=-1)
        qk = qk * cos + rot * sin
        return torch.cat([qk.reshape(n, 2 * H * hd), qkv[:, 2 * H * hd :]], 1)

    def _plan(self, lens):
        """The inputs' layout for attend: starts, lengths, and the
        cumulative lengths on the device for the varlen call."""
        starts, at = [], 0
        for n in lens:
            starts.append(at)
            at += n
        cu = None
        if self.varlen:
            cu = torch.tensor(starts + [at], dtype=torch.int32).to(self.device, non_blocking=True)
        return starts, list(lens), cu

    def attend(self, qkv, plan, W):
        """Attention of each input over itself alone: qkv [N, 3 * hidden]
        packed; W: a local layer's reach either side (0: everything).
        Returns [N, hidden]."""
        H, hd = self.cfg.heads, self.cfg.head_dim
        N = qkv.shape[0]
        q, k, v = qkv.view(N, 3, H, hd).unbind(1)
        starts, lens, cu = plan
        if self.varlen:
            m = max(lens)
            kw = {"window_size_left": W, "window_size_right": W} if W else {}
            o = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, m, m, 0.0, False, False, **kw)[0]
            return o.reshape(N, H * hd)
        out = torch.empty(N, H * hd, device=qkv.device, dtype=qkv.dtype)
        by_len = {}
        for a, n in zip(starts, lens):
            by_len.setdefault(n, []).append(a)
        for T, group in by_len.items():
            # Inputs of one length attend as one batch, no padding.
            idx = torch.tensor([a + j for a in group for j in range(T)], device=qkv.device)
            qq, kk, vv = (t[idx].view(len(group), T, H, hd).transpose(1, 2) for t in (q, k, v))
            mask = None
            if W and T > W + 1:
                i = torch.arange(T, device=qkv.device)
                mask = (i.unsqueeze(1) - i.unsqueeze(0)).abs() <= W
            if self.sdpa:
                o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask)
            else:
                s = torch.matmul(qq, kk.transpose(-1, -2)) * (hd ** -0.5)
                if mask is not None:
                    s = s.masked_fill(~mask, float("-inf"))
                o = torch.matmul(torch.softmax(s.float(), dim=-1).to(qq.dtype), vv)
            out[idx] = o.transpose(1, 2).reshape(len(group) * T, H * hd)
        return out


def _varlen_ok(enc, device, dtype):
    """Whether the varlen flash call runs here (CUDA, half precision) and
    agrees with the per-input path on two inputs of different lengths,
    globally and within a window of 2 either side."""
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return False
    H, hd = enc.cfg.heads, enc.cfg.head_dim
    try:
        g = torch.Generator(device="cpu").manual_seed(0)
        lens = [7, 12]
        qkv = torch.randn(sum(lens), 3 * H * hd, generator=g).to(device=device, dtype=dtype)
        for W in (0, 2):
            enc.varlen = True
            got = enc.attend(qkv, enc._plan(lens), W).float()
            enc.varlen = False
            want = enc.attend(qkv, enc._plan(lens), W).float()
            if (got - want).abs().max().item() > 0.05:
                log.warning("varlen flash attention disagrees with SDPA (window %d); inputs attend by length", W)
                return False
        return True
    except (RuntimeError, TypeError, AttributeError) as e:
        log.warning("varlen flash attention unavailable (%s); inputs attend by length", e)
        return False
    finally:
        enc.varlen = False

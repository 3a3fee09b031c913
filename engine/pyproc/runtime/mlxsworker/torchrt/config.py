"""config.json to a model description: the one place that knows each
family (ARCHS), and the fields the forward pass needs (Config).

A family is data: how its layer places its norms, which weights it has and
under which names, its activation, QK norm, attention scale, soft-capping,
sliding layers and rotary variants. The decoder (decoder.py) runs any
description; a family that needs code of its own keeps it in its own file
(gemma.py, moe.py, phi3.py) and is named here.
"""
import os

from . import quant
from ..errors import CheckpointError
from ..stcheck import read_json


class Family:
    """How one model_type is built. Fields:

    norm: "llama" (w * round(x / rms)), "olmo2" (w * x / rms, one rounding)
      or "gemma" ((1 + w) * x / rms, one rounding).
    layout: "pre" (Llama: norm, attend, add; norm, MLP, add), "sandwich"
      (Gemma: a norm before and after attention and before and after the
      MLP) or "post" (OLMo 2: a norm after attention and after the MLP only).
    qk_norm: None, "head" (each head of q and k, before RoPE) or "whole"
      (the whole q and k projections, before the head split).
    attn: "split" (q_proj, k_proj, v_proj) or "fused" (qkv_proj).
    mlp: "split" (gate_proj, up_proj), "fused" (gate_up_proj), or a mixture
      of experts: "qwen3_moe" or "mixtral" (moe.py), "gpt_oss" (gptoss.py).
    act: "silu", "gelu_tanh" or "clamped_glu" (gpt_oss's experts).
    bias: q, k and v biases always (Qwen2); else attention_bias decides.
    o_bias: o_proj has a bias too (gpt_oss).
    sinks: a learned attention sink per head, self_attn.sinks (gpt_oss):
      the Triton decode kernel and the varlen flash call take them, SDPA
      does not (gptoss.py).
    sliding: which layers slide when sliding_window is set and the config
      has no layer_types: "all", "gemma2" (even layers), "gemma3"
      (sliding_window_pattern), "qwen" (use_sliding_window and
      max_window_layers) or None.
    defaults: config fields the published config.json may leave out
      (transformers' defaults for the family).
    """

    def __init__(self, norm="llama", layout="pre", qk_norm=None, attn="split", mlp="split", act="silu", bias=False,
                 sliding=None, gemma=False, defaults=None, o_bias=False, sinks=False):
        self.norm, self.layout, self.qk_norm, self.attn, self.mlp, self.act = norm, layout, qk_norm, attn, mlp, act
        self.bias, self.sliding, self.gemma, self.defaults = bias, sliding, gemma, defaults or {}
        self.o_bias, self.sinks = o_bias, sinks


# Gemma3TextConfig's defaults: Google's gemma3 configs give only a few
# fields of text_config.
GEMMA3_DEFAULTS = {
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "query_pre_attn_scalar": 256, "sliding_window": 4096,
    "rope_local_base_freq": 10000.0, "sliding_window_pattern": 6, "tie_word_embeddings": True,
}

# GptOssConfig's defaults (gpt-oss-20b's values).
GPT_OSS_DEFAULTS = {
    "head_dim": 64, "sliding_window": 128, "rope_theta": 150000.0, "swiglu_limit": 7.0, "num_experts_per_tok": 4,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}

ARCHS = {
    "llama": Family(),
    "mistral": Family(sliding="all"),
    "qwen2": Family(bias=True, sliding="qwen"),
    "qwen3": Family(qk_norm="head", sliding="qwen"),
    "qwen3_moe": Family(qk_norm="head", mlp="qwen3_moe", sliding="qwen"),
    "mixtral": Family(mlp="mixtral", sliding="all"),
    "gemma2": Family(norm="gemma", layout="sandwich", act="gelu_tanh", sliding="gemma2", gemma=True),
    "gemma3_text": Family(norm="gemma", layout="sandwich", qk_norm="head", act="gelu_tanh", sliding="gemma3",
                          gemma=True, defaults=GEMMA3_DEFAULTS),
    "phi3": Family(attn="fused", mlp="fused", sliding="all"),
    "olmo2": Family(norm="olmo2", layout="post", qk_norm="whole"),
    # Without layer_types gpt_oss alternates from a sliding first layer.
    "gpt_oss": Family(norm="olmo2", mlp="gpt_oss", act="clamped_glu", bias=True, o_bias=True, sinks=True,
                      sliding="gemma2", defaults=GPT_OSS_DEFAULTS),
}
# Bidirectional encoders (the BERT family): they only embed, and have
# their own config reading and forward pass (encoder.py, served by
# encserve.py).
ENCODERS = ("bert", "modernbert")
# Checkpoints that wrap a text model: model_type -> the text model's type.
# gemma3 (Gemma3ForConditionalGeneration) keeps its language model's
# config under text_config and ignores its vision tower here.
WRAPPED = {"gemma3": "gemma3_text"}

# Upper bounds far above any real model, so a crafted config.json cannot ask
# for absurd KV memory before the weights' shapes are compared with it.
LIMITS = {"hidden": 1 << 17, "layers": 1 << 10, "heads": 1 << 10, "kv_heads": 1 << 10, "head_dim": 1 << 17,
          "intermediate": 1 << 19, "vocab": 1 << 22, "context": 1 << 24, "experts": 1 << 12}


def supported():
    return sorted(set(ARCHS) | set(WRAPPED) | set(ENCODERS))


class Config:
    """The fields of config.json the forward pass needs."""

    def __init__(self, directory):
        top = read_json(os.path.join(directory, "config.json"), "config.json")
        arch = top.get("model_type", "")
        wrapped = arch in WRAPPED
        if wrapped:
            c = top.get("text_config")
            if not isinstance(c, dict):
                raise CheckpointError("config.json", "%s: text_config is not an object" % arch)
            arch = WRAPPED[arch]
        else:
            c = top
        if arch in ENCODERS:
            raise CheckpointError("config.json", "%s is an encoder: it embeds (encoder.py) and does not generate" % arch)
        if arch not in ARCHS:
            raise CheckpointError("config.json", "unsupported architecture %r (want one of %s)" % (arch, ", ".join(supported())))
        fam = ARCHS[arch]
        c = dict(fam.defaults, **v4_names(c))
        self.arch, self.family, self.wrapped = arch, fam, wrapped
        try:
            self._read(c, top, fam)
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError("config.json", "missing or bad field: %s" % e)
        if (min(self.hidden, self.layers, self.heads, self.kv_heads, self.intermediate, self.vocab, self.head_dim, self.context) <= 0
                or self.heads % self.kv_heads or not 0 < self.rot_dim <= self.head_dim or self.rot_dim % 2):
            raise CheckpointError("config.json", "inconsistent sizes")
        for field, limit in LIMITS.items():
            if getattr(self, field) > limit:
                raise CheckpointError("config.json", "%s %d is beyond any supported model (limit %d)" % (field, getattr(self, field), limit))
        self.bos, self.eos = _special_ids(directory, top if wrapped else c)
        self.quant = quant.scheme(top)  # None for a float checkpoint
        # gpt_oss's MXFP4 experts dequantize at load (gptoss.py): the
        # model is served as a float one.
        self.mxfp4 = self.quant is not None and self.quant.kind == "mxfp4"
        if self.mxfp4:
            if arch != "gpt_oss":
                raise CheckpointError("config.json", "quant_method mxfp4 is gpt_oss's layout, not %s's" % arch)
            self.quant = None

    def _read(self, c, top, fam):
        self.hidden = int(c["hidden_size"])
        self.layers = int(c["num_hidden_layers"])
        self.heads = int(c["num_attention_heads"])
        self.kv_heads = int(c.get("num_key_value_heads") or self.heads)
        self.head_dim = int(c.get("head_dim") or self.hidden // self.heads)
        self.intermediate = int(c["intermediate_size"])
        self.vocab = int(c["vocab_size"])
        self.context = int(c.get("max_position_embeddings") or 2048)
        self.max_position = self.context  # before a serving limit lowers context (longrope's scale)
        self.eps = float(c.get("rms_norm_eps") or 1e-5)
        self.theta = float(c.get("rope_theta") or 10000.0)
        self.rope_scaling = c.get("rope_scaling")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
            raise ValueError("rope_scaling is not an object")
        self.original_context = c.get("original_max_position_embeddings")
        self.context = max(self.context, _yarn_context(self.rope_scaling, self.context))
        self.rot_dim = int(self.head_dim * float(c.get("partial_rotary_factor") or 1.0))
        self.tie = bool(c.get("tie_word_embeddings", top.get("tie_word_embeddings", False)))
        self.bias = fam.bias or bool(c.get("attention_bias", False))
        self.dtype = c.get("torch_dtype") or top.get("torch_dtype") or top.get("dtype") or "float32"
        # Attention: the scale of q.k, soft-capping of the scores and of
        # the final logits (Gemma 2; null in Gemma 3), and the local
        # layers' RoPE base (Gemma 3: no scaling on those).
        if fam.gemma and not float(c["query_pre_attn_scalar"]) > 0:
            raise ValueError("query_pre_attn_scalar must be positive")
        self.scale = float(c["query_pre_attn_scalar"]) ** -0.5 if fam.gemma else self.head_dim ** -0.5
        self.attn_softcap = float(c.get("attn_logit_softcapping") or 0) if fam.gemma else 0.0
        self.final_softcap = float(c.get("final_logit_softcapping") or 0) if fam.gemma else 0.0
        self.local_theta = float(c.get("rope_local_base_freq") or 10000.0) if self.arch == "gemma3_text" else None
        # windows[i]: layer i's sliding window (keys i - W < j <= i), 0 for full attention.
        self.windows = sliding_windows(c, fam, self.layers)
        # Mixtures of experts (moe.py).
        self.experts = 0
        if fam.mlp == "qwen3_moe":
            self.experts = int(c["num_experts"])
            self.moe_intermediate = int(c["moe_intermediate_size"])
            self.norm_topk = bool(c.get("norm_topk_prob", False))
            step = int(c.get("decoder_sparse_step") or 1)
            dense = set(int(i) for i in c.get("mlp_only_layers") or [])
            self.sparse = [i not in dense and (i + 1) % step == 0 for i in range(self.layers)]
        elif fam.mlp in ("mixtral", "gpt_oss"):
            self.experts = int(c["num_local_experts"])
            self.moe_intermediate = self.intermediate
            self.norm_topk = fam.mlp == "mixtral"  # gpt_oss: a softmax over the top k logits (gptoss.route)
            self.sparse = [True] * self.layers
        # gpt_oss's experts clamp gate to at most this and up to +-this.
        self.swiglu_limit = float(c["swiglu_limit"]) if fam.mlp == "gpt_oss" else 0.0
        if fam.mlp == "gpt_oss" and not self.swiglu_limit > 0:
            raise ValueError("swiglu_limit %r must be positive" % self.swiglu_limit)
        if self.experts:
            self.top_k = int(c["num_experts_per_tok"])
            if not 0 < self.top_k <= self.experts or self.moe_intermediate <= 0:
                raise ValueError("num_experts_per_tok %d of %d experts" % (self.top_k, self.experts))


def v4_names(c):
    """c with transformers 5's names mapped to the published ones:
    rope_parameters (keyed by layer type for Gemma 3, holding Phi-3's
    partial_rotary_factor) to rope_theta, rope_scaling,
    rope_local_base_freq and partial_rotary_factor; dtype to torch_dtype;
    num_local_experts to num_experts where the family says num_experts."""
    c = dict(c)

    def put(k, v):
        if c.get(k) is None:
            c[k] = v

    rp = c.pop("rope_parameters", None)
    if isinstance(rp, dict):
        full, local = rp, None
        if isinstance(rp.get("full_attention"), dict):
            full, local = rp["full_attention"], rp.get("sliding_attention")
        full = dict(full)
        put("rope_theta", full.pop("rope_theta", None))
        if "partial_rotary_factor" in full:
            put("partial_rotary_factor", full.pop("partial_rotary_factor"))
        if (full.get("rope_type") or full.get("type") or "default") != "default":
            put("rope_scaling", full)
        if isinstance(local, dict):
            put("rope_local_base_freq", local.get("rope_theta"))
    put("torch_dtype", c.get("dtype"))
    if c.get("model_type") == "qwen3_moe":
        put("num_experts", c.get("num_local_experts"))
    return c


def sliding_windows(c, fam, n):
    """Each layer's sliding window (0: the layer sees every earlier key):
    layer_types when the config lists them, else the family's rule."""
    W = int(c.get("sliding_window") or 0)
    if W < 0:
        raise ValueError("sliding_window %d is negative" % W)
    types = c.get("layer_types")
    if types:
        if not isinstance(types, list) or len(types) != n:
            raise ValueError("layer_types lists %s layers, not %d" % (len(types) if isinstance(types, list) else "no", n))
        unknown = sorted({str(t) for t in types} - {"sliding_attention", "full_attention"})
        if unknown:
            raise ValueError("layer_types: unsupported %s (want sliding_attention or full_attention)" % ", ".join(unknown))
    if W == 0:
        return [0] * n
    if types:
        return [W if t == "sliding_attention" else 0 for t in types]
    rule = fam.sliding
    if rule == "all":
        return [W] * n
    if rule == "gemma2":  # even layers slide
        return [W if i % 2 == 0 else 0 for i in range(n)]
    if rule == "gemma3":  # every pattern-th layer is global
        pattern = int(c.get("sliding_window_pattern") or 6)
        if pattern < 1:
            raise ValueError("sliding_window_pattern %d must be at least 1" % pattern)
        return [W if (i + 1) % pattern else 0 for i in range(n)]
    if rule == "qwen" and c.get("use_sliding_window"):
        start = int(c.get("max_window_layers") or 0)
        return [W if i >= start else 0 for i in range(n)]
    return [0] * n


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


def _yarn_context(rs, max_position):
    """The positions a yarn rope_scaling serves: original_max_position_embeddings
    (else max_position) times factor, as vLLM derives it, so Qwen's yarn
    setting serves its 131,072 tokens without editing
    max_position_embeddings too; 0 for other kinds or a malformed entry
    (rope.yarn refuses that, naming the field)."""
    if not rs or (rs.get("rope_type") or rs.get("type")) != "yarn":
        return 0
    try:
        return int(float(rs.get("original_max_position_embeddings") or max_position) * float(rs["factor"]))
    except (KeyError, TypeError, ValueError):
        return 0

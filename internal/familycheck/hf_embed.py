"""Embedding models against transformers: pooled vectors.

For each shape: the published config.json of an embedding model, the
bare model built by transformers with random weights (BertModel,
ModernBertModel, Qwen3Model, as sentence-transformers checkpoints hold
them: no prefix, no head), saved with save_pretrained in float32 and
bfloat16; 32 inputs of random token ids; transformers' last_hidden_state
of each input alone, pooled here (mean, cls, lasttoken: the
sentence-transformers Pooling module's modes, before any Normalize). The
engine then embeds the same inputs (familycheck -embed) and `compare`
prints, per shape, dtype and pooling, the largest absolute difference and
the smallest cosine similarity.

    python3 hf_embed.py build OUT [shape ...]
    familycheck -embed -dir OUT/S/float32 -in OUT/S/inputs.json -dtype float32 > OUT/S/pyproc-float32.json
    python3 hf_embed.py compare OUT

Weights are drawn as hf_families.py draws them (linear weights of std
1/sqrt(fan-in), norms around 1, biases 0.1), so hidden states are not
the near-constant rows transformers' std 0.02 gives.
"""
import json
import math
import os
import sys

import torch

N_INPUTS = 32
POOLS = ("mean", "cls", "lasttoken")

# BAAI/bge-base-en-v1.5 (CLS pooling, normalized).
BGE_BASE = dict(model_type="bert", hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                vocab_size=30522, max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu",
                position_embedding_type="absolute", pad_token_id=0)
# Qwen/Qwen3-Embedding-0.6B (last-token pooling, normalized).
QWEN3_EMBED = dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                   num_key_value_heads=8, head_dim=128, vocab_size=151669, max_position_embeddings=32768, rms_norm_eps=1e-6,
                   rope_theta=1000000.0, tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
                   sliding_window=None, max_window_layers=28)
# Alibaba-NLP/gte-modernbert-base (ModernBERT-base; CLS pooling).
MODERNBERT_BASE = dict(model_type="modernbert", hidden_size=768, intermediate_size=1152, num_hidden_layers=22,
                       num_attention_heads=12, vocab_size=50368, max_position_embeddings=8192, global_attn_every_n_layers=3,
                       local_attention=128, global_rope_theta=160000.0, local_rope_theta=10000.0, norm_eps=1e-5,
                       norm_bias=False, attention_bias=False, mlp_bias=False, hidden_activation="gelu",
                       pad_token_id=50283, bos_token_id=50281, eos_token_id=50282, cls_token_id=50281, sep_token_id=50282)

# shape: (published config, longest input, note)
SHAPES = {
    "bge-base": (BGE_BASE, 512, "bge-base-en-v1.5 (BertModel)"),
    "qwen3-embedding-0.6b": (QWEN3_EMBED, 1000, "Qwen3-Embedding-0.6B (Qwen3Model)"),
    "modernbert-base": (MODERNBERT_BASE, 1000, "gte-modernbert-base (ModernBertModel; local window 128 crossed)"),
}


def init_weights(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                if "norm" in name.lower():
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
                else:  # biases
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 if "position" in name or "token_type" in name else 1.0))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


def pool(h, mode):
    if mode == "mean":
        return h.mean(0)
    if mode == "cls":
        return h[0]
    return h[-1]


def build(out, names):
    import transformers
    from transformers import AutoConfig, AutoModel
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print("torch", torch.__version__, "transformers", transformers.__version__, device, flush=True)
    for seed, name in enumerate(names):
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        published, longest, _ = SHAPES[name]
        c = dict(published)
        mt = c.pop("model_type")
        try:
            cfg = AutoConfig.for_model(mt, **c)
        except Exception as e:  # a family this transformers does not know
            print("%s: skipped: %s" % (name, e), flush=True)
            continue
        cfg._attn_implementation = "eager"
        if mt == "modernbert":
            cfg.reference_compile = False
        torch.manual_seed(seed)
        model = AutoModel.from_config(cfg)  # the bare model: BertModel, ModernBertModel, Qwen3Model
        model.to(torch.float32)
        init_weights(model, seed)
        model.eval()
        g = torch.Generator().manual_seed(2000 + seed)
        lens = [1, 2, longest] + torch.randint(3, longest, (N_INPUTS - 3,), generator=g).tolist()
        vocab = min(cfg.vocab_size, 30000)
        inputs = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]
        with open(os.path.join(d, "inputs.json"), "w") as f:
            json.dump(inputs, f)
        for dtype in (torch.float32, torch.bfloat16):
            dn = str(dtype).split(".")[-1]
            model.to(dtype=dtype)
            model.save_pretrained(os.path.join(d, dn), safe_serialization=True)
            model.to(device)
            ref = {p: [] for p in POOLS}
            with torch.no_grad():
                for ids in inputs:
                    h = model(input_ids=torch.tensor([ids], device=device)).last_hidden_state[0].float()
                    for p in POOLS:
                        ref[p].append(pool(h, p).cpu().tolist())
            model.to("cpu")
            with open(os.path.join(d, "hf-%s.json" % dn), "w") as f:
                json.dump(ref, f)
            print("%s %s: saved, reference done" % (name, dn), flush=True)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()


def compare(out):
    print("| shape | dtype | pooling | inputs | max abs diff | max |ref| | min cosine | mean cosine |")
    print("|---|---|---|---|---|---|---|---|")
    for name in SHAPES:
        d = os.path.join(out, name)
        for dtype in ("float32", "bfloat16"):
            ref_path, got_path = os.path.join(d, "hf-%s.json" % dtype), os.path.join(d, "pyproc-%s.json" % dtype)
            if not os.path.exists(ref_path) or not os.path.exists(got_path) or os.path.getsize(got_path) == 0:
                continue
            ref = json.load(open(ref_path))
            try:
                got = json.load(open(got_path))
            except ValueError:
                print("| %s | %s | | (no output) | | | | |" % (name, dtype))
                continue
            for p in POOLS:
                if p not in got:
                    continue
                r, o = torch.tensor(ref[p], dtype=torch.float64), torch.tensor(got[p], dtype=torch.float64)
                cos = torch.nn.functional.cosine_similarity(r, o, dim=1)
                print("| %s | %s | %s | %d | %.3g | %.3g | %.6f | %.6f |" % (name, dtype, p, r.shape[0], (r - o).abs().max(),
                                                                       r.abs().max(), cos.min(), cos.mean()))


if __name__ == "__main__":
    cmd, out = sys.argv[1], sys.argv[2]
    if cmd == "build":
        build(out, sys.argv[3:] or list(SHAPES))
    elif cmd == "compare":
        compare(out)
    else:
        raise SystemExit("usage: hf_embed.py build|compare OUT [shape ...]")

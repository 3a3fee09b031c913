"""Each model family against transformers, token for token.

For every family: its published config.json (trimmed to a few layers),
the model built by transformers with random weights, saved with
save_pretrained in float32 and bfloat16; 32 prompts of random token ids
(long enough to cross the family's sliding window); transformers'
greedy generate of 32 tokens with the logits of each step. The engines
then serve the saved directories (familycheck) and `compare` prints, per
family, engine and dtype, how many prompts gave the same 32 tokens and how
far the chosen tokens' log-probabilities are from transformers'.

    python3 hf_families.py build OUT [family ...]    # checkpoints, prompts, references
    familycheck -engine pyproc -dir OUT/F/float32 -in OUT/F/prompts.json -dtype float32 > OUT/F/pyproc-float32.json
    familycheck -engine pyproc -one ... > OUT/F/pyproc-one-bfloat16.json   # a prompt at a time: one-row decode
    python3 hf_families.py compare OUT               # the table

Weights are drawn like testmodel draws them (linear weights with std
1/sqrt(fan-in), norms around their identity, embeddings of norm about
sqrt(hidden), Gemma's about 1) rather than transformers' std 0.02, under
which the logits are so flat that greedy tokens are near ties everywhere.
Where a published window is longer than the prompts here it is shortened
(the family note says so), so the sliding layers are exercised.
"""
import json
import math
import os
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

N_PROMPTS, N_NEW = 32, 32

LLAMA32_1B = dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
                  rope_theta=500000.0, tie_word_embeddings=True,
                  rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=8192))
QWEN3_06B = dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
                 rope_theta=1000000.0, tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
                 sliding_window=None, max_window_layers=28)
QWEN3_30B_A3B = dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                     num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                     num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                     vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
                     tie_word_embeddings=False, use_sliding_window=False, sliding_window=None, max_window_layers=48)
MIXTRAL_8X7B = dict(model_type="mixtral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                    num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
                    max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None,
                    tie_word_embeddings=False)
MISTRAL_7B = dict(model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768, rms_norm_eps=1e-5,
                  rope_theta=10000.0, sliding_window=4096, tie_word_embeddings=False)
GEMMA3_1B = dict(model_type="gemma3_text", hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
                 num_key_value_heads=1, head_dim=256, vocab_size=262144, max_position_embeddings=32768, rms_norm_eps=1e-6,
                 rope_theta=1000000.0, rope_local_base_freq=10000.0, sliding_window=512, sliding_window_pattern=6,
                 query_pre_attn_scalar=256, hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None,
                 attn_logit_softcapping=None, rope_scaling=None, tie_word_embeddings=True)
GEMMA3_4B_TEXT = dict(GEMMA3_1B, hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
                      num_key_value_heads=4, vocab_size=262208, max_position_embeddings=131072, sliding_window=1024,
                      rope_scaling=dict(rope_type="linear", factor=8.0))
GEMMA2_2B = dict(model_type="gemma2", hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
                 num_key_value_heads=4, head_dim=256, vocab_size=256000, max_position_embeddings=8192, rms_norm_eps=1e-6,
                 rope_theta=10000.0, sliding_window=4096, query_pre_attn_scalar=256, hidden_activation="gelu_pytorch_tanh",
                 attn_logit_softcapping=50.0, final_logit_softcapping=30.0, tie_word_embeddings=True)
PHI4_MINI = dict(model_type="phi3", hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=24,
                 num_key_value_heads=8, vocab_size=200064, max_position_embeddings=131072,
                 original_max_position_embeddings=4096, partial_rotary_factor=0.75, rope_theta=10000.0, rms_norm_eps=1e-5,
                 sliding_window=262144, tie_word_embeddings=True, hidden_act="silu",
                 rope_scaling=dict(type="longrope",
                                   short_factor=[1.0 + 0.05 * i / 47 for i in range(48)],
                                   long_factor=[1.0 + 31.0 * (i / 47) ** 2 for i in range(48)]))
OLMO2_1B = dict(model_type="olmo2", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16,
                num_key_value_heads=16, vocab_size=100352, max_position_embeddings=4096, rms_norm_eps=1e-6,
                rope_theta=500000.0, tie_word_embeddings=False)
GPT_OSS_20B = dict(model_type="gpt_oss", hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, num_attention_heads=64,
                   num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4, vocab_size=201088,
                   max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=150000.0, sliding_window=128,
                   attention_bias=True, tie_word_embeddings=False, swiglu_limit=7.0,
                   rope_scaling=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
                                     original_max_position_embeddings=4096))
QWEN3_06B_YARN = dict(QWEN3_06B, rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32768))

# family: (published config, layers kept, overrides, longest prompt, note)
FAMILIES = {
    "llama": (LLAMA32_1B, 2, {}, 300, "Llama-3.2-1B"),
    "qwen3": (QWEN3_06B, 2, {}, 300, "Qwen3-0.6B"),
    "mistral": (MISTRAL_7B, 2, {"sliding_window": 128}, 400, "Mistral-7B-v0.1, window 4096 -> 128"),
    "gemma3_text": (GEMMA3_1B, 6, {}, 700, "gemma-3-1b (window 512; layer 6 global)"),
    "gemma3": (GEMMA3_4B_TEXT, 6, {}, 1300, "gemma-3-4b multimodal checkpoint, language model (window 1024)"),
    "gemma2": (GEMMA2_2B, 2, {"sliding_window": 128}, 400, "gemma-2-2b, window 4096 -> 128"),
    "qwen3_moe": (QWEN3_30B_A3B, 2, {}, 300, "Qwen3-30B-A3B (128 experts, 8 active)"),
    "mixtral": (MIXTRAL_8X7B, 2, {}, 300, "Mixtral-8x7B"),
    "phi3": (PHI4_MINI, 2, {}, 300, "Phi-4-mini (longrope short factors: prompts within 4096)"),
    "olmo2": (OLMO2_1B, 2, {}, 300, "OLMo-2-0425-1B"),
    "qwen3_yarn": (QWEN3_06B_YARN, 2, {}, 300, "Qwen3-0.6B with Qwen's YaRN setting (factor 4 over 32,768)"),
    "gpt_oss": (GPT_OSS_20B, 2, {}, 300, "gpt-oss-20b (window 128, sinks, 32 experts, 4 active; float experts)"),
}


def make_config(name):
    published, layers, overrides, _, _ = FAMILIES[name]
    c = dict(published, **overrides)
    c["num_hidden_layers"] = layers
    c.pop("layer_types", None)  # derived again by transformers from the pattern for the kept layers
    c["torch_dtype"] = "float32"
    if name == "qwen3_moe":
        c["max_window_layers"] = layers
    text = dict(c)
    mt = text.pop("model_type")
    if name != "gemma3":
        return AutoConfig.for_model(mt, **text)
    from transformers import Gemma3Config
    vision = dict(model_type="siglip_vision_model", hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                  num_attention_heads=2, image_size=56, patch_size=14)
    return Gemma3Config(text_config=dict(text, model_type="gemma3_text"), vision_config=vision, mm_tokens_per_image=4)


def init_weights(model, gemma, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = model.config.get_text_config().hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 or name.endswith("_bias"):  # gpt_oss's expert biases are [E, out]
                if "norm" in name or "layernorm" in name:
                    base = 0.0 if gemma else 1.0
                    p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
                else:  # biases
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                std = 1 / math.sqrt(hidden) if gemma else 1.0
                p.copy_(std * torch.randn(p.shape, generator=g))
            else:
                # gpt_oss stacks its experts as [E, in, out] (x @ W); every
                # other weight here is [..., out, in].
                fan_in = p.shape[-2] if model.config.model_type == "gpt_oss" and ".experts." in name else p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))


def reference(model, prompts, device):
    out = []
    for ids in prompts:
        x = torch.tensor([ids], device=device)
        r = model.generate(x, max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False, output_logits=True,
                           return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
        toks = r.sequences[0, len(ids):].tolist()
        lps, gaps = [], []
        for t, lg in zip(toks, r.logits):
            lp = torch.log_softmax(lg[0].float(), -1)
            top = torch.topk(lp, 2).values
            lps.append(float(lp[t]))
            gaps.append(float(top[0] - top[1]))
        out.append({"tokens": toks, "logprobs": lps, "gaps": gaps})
    return out


def build(out, names):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print("torch", torch.__version__, "transformers", transformers.__version__, device, flush=True)
    for seed, name in enumerate(names):
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        try:
            cfg = make_config(name)
        except Exception as e:  # a family this transformers does not know
            print("%s: skipped: %s" % (name, e), flush=True)
            continue
        cfg._attn_implementation = "eager"  # transformers' own attention, soft-capping included
        torch.manual_seed(seed)
        if name == "gemma3":
            model = transformers.Gemma3ForConditionalGeneration(cfg)
        else:
            model = AutoModelForCausalLM.from_config(cfg)
        model.to(torch.float32)
        init_weights(model, name.startswith("gemma"), seed)
        model.eval()
        vocab = cfg.get_text_config().vocab_size
        longest = FAMILIES[name][3]
        g = torch.Generator().manual_seed(1000 + seed)
        lens = [1, 2, longest] + torch.randint(3, longest, (N_PROMPTS - 3,), generator=g).tolist()
        prompts = [torch.randint(0, min(vocab, 100000), (n,), generator=g).tolist() for n in lens]
        with open(os.path.join(d, "prompts.json"), "w") as f:
            json.dump(prompts, f)
        for dtype in (torch.float32, torch.bfloat16):
            dn = str(dtype).split(".")[-1]
            model.to(dtype=dtype)
            model.save_pretrained(os.path.join(d, dn), safe_serialization=True)
            model.to(device)
            with torch.no_grad():
                ref = reference(model, prompts, device)
            model.to("cpu")
            with open(os.path.join(d, "hf-%s.json" % dn), "w") as f:
                json.dump(ref, f)
            print("%s %s: saved, reference done" % (name, dn), flush=True)
        del model
        torch.cuda.empty_cache() if device == "cuda" else None


def compare(out):
    print("| family | engine | dtype | same 32 tokens | same up to a near tie (gap < 1e-3) | max abs logprob diff (matched tokens) |")
    print("|---|---|---|---|---|---|")
    for name in FAMILIES:
        d = os.path.join(out, name)
        for dtype in ("float32", "bfloat16"):
            ref_path = os.path.join(d, "hf-%s.json" % dtype)
            if not os.path.exists(ref_path):
                continue
            ref = json.load(open(ref_path))
            for eng in ("pyproc", "pyproc-one", "mlx"):
                p = os.path.join(d, "%s-%s.json" % (eng, dtype))
                if not os.path.exists(p) or os.path.getsize(p) == 0:
                    continue
                try:
                    got = json.load(open(p))
                except ValueError:
                    print("| %s | %s | %s | (no output) | | |" % (name, eng, dtype))
                    continue
                same = tie = 0
                worst = 0.0
                for r, o in zip(ref, got):
                    k = 0
                    while k < len(r["tokens"]) and k < len(o["tokens"]) and r["tokens"][k] == o["tokens"][k]:
                        worst = max(worst, abs(r["logprobs"][k] - o["logprobs"][k]))
                        k += 1
                    if k == len(r["tokens"]):
                        same += 1
                    elif r["gaps"][k] < 1e-3:
                        tie += 1
                print("| %s | %s | %s | %d/%d | %d/%d | %.2g |" % (name, eng, dtype, same, len(ref), same + tie, len(ref), worst))


if __name__ == "__main__":
    cmd, out = sys.argv[1], sys.argv[2]
    if cmd == "build":
        build(out, sys.argv[3:] or list(FAMILIES))
    elif cmd == "compare":
        compare(out)
    else:
        raise SystemExit("usage: hf_families.py build|compare OUT [family ...]")

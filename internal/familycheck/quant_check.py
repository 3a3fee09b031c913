"""The engine's greedy tokens on quantized checkpoints against two
references, teacher-forced on the engine's own tokens (so one early
disagreement does not hide the rest):

- the reference forward pass (internal/reference/reference.py: float64,
  the checkpoint dequantized from the file's bytes), and
- transformers loading the same directory, where it can without packages
  that are missing (its built-in FP8 integration for quant_method fp8;
  compressed-tensors, AWQ and GPTQ need compressed-tensors, autoawq or
  gptqmodel/optimum; the row says why it was skipped).

For each step: whether the engine's token is the reference's top token
(steps where the reference's top two are within GAP are near ties and not
counted), and |engine log-probability - reference log-probability| of the
engine's token.

    python3 quant_check.py prompts OUT.json                 # 8 random prompts (vocab 384)
    python3 quant_check.py check DIR ENGINE.json PROMPTS.json NAME [FLOATDIR]

Tolerance: the engine serves with bfloat16 activations (the quantized
kernels run only in bf16/fp16), the reference in float64 on the same
dequantized weights, so the differences are bf16's: on the 4-layer
TinyQuant model a row passes when every non-tie step agrees and the worst
log-probability difference is below 0.1 (bf16 keeps 8 bits: a logit of
magnitude 10 moves by up to 0.04, and the differences add over layers).
"""
import json
import os
import random
import sys

import torch

GAP, TOL = 0.05, 0.1
HERE = os.path.dirname(os.path.abspath(__file__))


def reference_module():
    """reference.py's functions (load, dequantize, text_weights, forward)
    without running its main."""
    path = os.path.join(HERE, "..", "reference", "reference.py")
    src = open(path).read()
    src = src[: src.rindex("\nmain()")]
    ns = {"__name__": "reference"}
    exec(compile(src, path, "exec"), ns)
    return ns


def reference_logprobs(d, prompts, runs):
    """Per prompt, per step: the reference's log-probabilities [vocab]."""
    ref = reference_module()
    top = json.load(open(os.path.join(d, "config.json")))
    q = top.get("quantization_config")
    c = top.get("text_config") or top
    w = ref["text_weights"](ref["dequantize"](ref["load"](d), q))
    out = []
    for p, r in zip(prompts, runs):
        ids, steps = list(p), []
        for t in r["tokens"]:
            steps.append(torch.log_softmax(ref["forward"](w, c, ids), -1))
            ids.append(t)
        out.append(steps)
    return out


def hf_logprobs(d, prompts, runs):
    """transformers' log-probabilities, or the reason it cannot load d."""
    try:
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.bfloat16, device_map="cuda")
    except Exception as e:  # a missing package or an unsupported layout
        return "transformers cannot load it: %s" % str(e).splitlines()[0][:160]
    out = []
    with torch.no_grad():
        for p, r in zip(prompts, runs):
            ids = torch.tensor([list(p) + r["tokens"]], device="cuda")
            lp = torch.log_softmax(model(ids).logits[0].double(), -1).cpu()
            out.append([lp[len(p) - 1 + k] for k in range(len(r["tokens"]))])
    return out


def score(runs, ref):
    agree = counted = 0
    worst = 0.0
    for r, steps in zip(runs, ref):
        for t, lp_eng, lp in zip(r["tokens"], r["logprobs"], steps):
            top2 = torch.topk(lp, 2).values
            if top2[0] - top2[1] >= GAP:
                counted += 1
                agree += int(int(torch.argmax(lp)) == t)
            worst = max(worst, abs(float(lp[t]) - lp_eng))
    return agree, counted, worst


def check(d, eng_json, prompts_json, name, float_dir=None):
    prompts = json.load(open(prompts_json))
    runs = json.load(open(eng_json))
    rows = [("reference (dequantized, float64)", reference_logprobs(d, prompts, runs))]
    if float_dir:
        rows.append(("float model (before quantization)", reference_logprobs(float_dir, prompts, runs)))
    rows.append(("transformers", hf_logprobs(d, prompts, runs) if torch.cuda.is_available() else "no CUDA"))
    for what, ref in rows:
        if isinstance(ref, str):
            print("| %s | %s | skipped: %s | | |" % (name, what, ref))
            continue
        agree, counted, worst = score(runs, ref)
        ok = agree == counted and worst < TOL
        verdict = "pass" if ok else "FAIL"
        if what.startswith("float model"):
            verdict = "(quantization error, no tolerance)"
        print("| %s | %s | %d/%d | %.3g | %s |" % (name, what, agree, counted, worst, verdict))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "prompts":
        rng = random.Random(33)
        json.dump([[rng.randrange(384) for _ in range(n)] for n in (1, 5, 9, 17, 24, 33, 48, 60)], open(sys.argv[2], "w"))
    elif cmd == "header":
        print("| checkpoint | against | top token agrees (steps not near a tie, gap >= %g) | max abs logprob diff | verdict (< %g) |" % (GAP, TOL))
        print("|---|---|---|---|---|")
    elif cmd == "check":
        check(*sys.argv[2:])
    else:
        raise SystemExit("usage: quant_check.py prompts OUT | header | check DIR ENGINE.json PROMPTS.json NAME [FLOATDIR]")

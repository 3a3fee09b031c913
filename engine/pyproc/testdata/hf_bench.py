"""transformers' LlamaForCausalLM on a checkpoint, for the GPU comparison.

  hf_bench.py check DIR DTYPE   prompts on stdin ({"prompts": [[ids]], "n": k});
                                prints greedy tokens and their logprobs
  hf_bench.py bench DIR B,B,..  prints generate's tokens/s per batch size
"""
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def model(path, dtype):
    m = AutoModelForCausalLM.from_pretrained(path, torch_dtype=getattr(torch, dtype))
    return m.cuda().eval()


def check(path, dtype):
    m = model(path, dtype)
    req = json.load(sys.stdin)
    out = []
    with torch.no_grad():
        for ids in req["prompts"]:
            ids, toks, lps, gaps = list(ids), [], [], []
            for _ in range(req["n"]):
                logits = m(torch.tensor([ids], device="cuda")).logits[0, -1].float()
                lp = torch.log_softmax(logits, -1)
                top = torch.topk(lp, 2).values
                t = int(torch.argmax(lp))
                toks.append(t)
                lps.append(float(lp[t]))
                gaps.append(float(top[0] - top[1]))
                ids.append(t)
            out.append({"tokens": toks, "logprobs": lps, "gaps": gaps})
    json.dump(out, sys.stdout)


def bench(path, batches, prompt=128, gen=128):
    m = model(path, "bfloat16")
    res = {}
    with torch.no_grad():
        for b in batches:
            ids = torch.randint(0, 1000, (b, prompt), device="cuda")
            kw = dict(max_new_tokens=gen, min_new_tokens=gen, do_sample=False, pad_token_id=0)
            m.generate(ids, **dict(kw, max_new_tokens=4, min_new_tokens=4))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            m.generate(ids, **kw)
            torch.cuda.synchronize()
            res[b] = b * gen / (time.perf_counter() - t0)
            print("generate batch %d: %.1f tokens/s" % (b, res[b]), file=sys.stderr)
    json.dump(res, sys.stdout)


if __name__ == "__main__":
    if sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    else:
        bench(sys.argv[2], [int(x) for x in sys.argv[3].split(",")])

"""transformers' LlamaForCausalLM on a checkpoint, for the GPU comparison.

  hf_bench.py check DIR DTYPE    prompts on stdin ({"prompts": [[ids]], "n": k});
                                 prints greedy tokens and their logprobs
  hf_bench.py bench DIR B,B,..   prints generate's tokens/s per batch size
  hf_bench.py static DIR B,B,..  the same with a static cache, which makes
                                 generate compile the model (torch.compile)
  hf_bench.py prefill DIR BxN,.. prints one forward pass's prompt tokens/s
  hf_bench.py info               the device and the library versions
"""
import json
import sys
import time

import torch


def model(path, dtype):
    from transformers import AutoModelForCausalLM  # here: info runs without transformers (a CPU dry run)
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


def bench(path, batches, static=False, prompt=128, gen=128):
    """Decode tokens/s: the time of generate for gen new tokens, less the
    time of generate for one new token (the prefill), over b * (gen - 1)."""
    m = model(path, "bfloat16")
    res = {}
    name = "static cache + compile" if static else "generate"
    with torch.no_grad():
        for b in batches:
            ids = torch.randint(0, 1000, (b, prompt), device="cuda")
            kw = dict(max_new_tokens=gen, min_new_tokens=gen, do_sample=False, pad_token_id=0)
            if static:
                kw["cache_implementation"] = "static"
            one = dict(kw, max_new_tokens=1, min_new_tokens=1)
            # Warm-up; with the static cache generate compiles the decode
            # step for this batch size and cache length.
            for _ in range(2 if static else 1):
                m.generate(ids, **(kw if static else dict(kw, max_new_tokens=4, min_new_tokens=4)))
            t = []
            for args in ((one, kw, one, kw) if static else (one, kw)):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                m.generate(ids, **args)
                torch.cuda.synchronize()
                t.append(time.perf_counter() - t0)
            dec = min(t[1::2]) - min(t[0::2])
            res[b] = b * (gen - 1) / dec
            print("%s batch %d: %.1f tokens/s" % (name, b, res[b]), file=sys.stderr)
    json.dump(res, sys.stdout)


def prefill(path, cases):
    m = model(path, "bfloat16")
    res = {}
    with torch.no_grad():
        for c in cases:
            b, n = (int(x) for x in c.split("x"))
            ids = torch.randint(0, 1000, (b, n), device="cuda")
            m(ids)
            t = []
            for _ in range(5):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                m(ids, logits_to_keep=1)
                torch.cuda.synchronize()
                t.append(time.perf_counter() - t0)
            res[c] = b * n / sorted(t)[len(t) // 2]
            print("forward %s: %.0f tokens/s" % (c, res[c]), file=sys.stderr)
    json.dump(res, sys.stdout)


def info():
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print("%s, torch %s, transformers %s, triton %s" % (device, torch.__version__, _version("transformers"),
                                                        _version("triton")))


def _version(name):
    try:
        return __import__(name).__version__
    except ImportError:
        return "none"


if __name__ == "__main__":
    if sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "info":
        info()
    elif sys.argv[1] == "prefill":
        prefill(sys.argv[2], sys.argv[3].split(","))
    else:
        bench(sys.argv[2], [int(x) for x in sys.argv[3].split(",")], static=sys.argv[1] == "static")

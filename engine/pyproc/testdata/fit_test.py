"""The weight check before a load (runtime/mlxsworker/torchrt/fit.py).

- fit.need from the safetensors headers equals the bytes the loaded
  decoder holds (tp.weight_bytes), in float32 and bfloat16, for each
  model dir given (the first untied: a multimodal Gemma 3 checkpoint's
  vision tensors left out, gpt-oss's MXFP4 experts as they dequantize),
  and for the first with a second copy of its weights in another file
  (with and without an index) and tied with its lm_head still stored;
  under tensor parallel n the split projections and the head count 1/n
  and the rest whole;
- fit.check refuses weights past the free memory with out_of_memory,
  naming the gigabytes needed and free and what to do, and passes
  weights that fit;
- a GPU worker computes torch's CPU ops on one thread once a model runs on
  a GPU, loads later models on every core, and keeps --threads when given.

  python3 fit_test.py RUNTIME_DIR MODEL_DIR...

Prints "N passed, 0 failed" or raises. Run by TestFitCheck.
"""
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the runtime or in testdata
sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402

from mlxsworker.errors import OUT_OF_MEMORY, ProtocolError  # noqa: E402
from mlxsworker.torchrt import fit, tp  # noqa: E402
from mlxsworker.torchrt.model import TorchModel  # noqa: E402
from mlxsworker.torchrt.st import SafetensorsFile  # noqa: E402

passed = 0


def ok(cond, what):
    global passed
    if not cond:
        raise AssertionError(what)
    passed += 1


def exact(path, label=""):
    for dtype in ("float32", "bfloat16"):
        m = TorchModel(path, {"device": "cpu", "dtype": dtype, "max_batch": 4})
        held, est = tp.weight_bytes(m.model), fit.need(path, m.dtype, tie=m.cfg.tie)
        ok(held == est, "%s%s %s: need %d bytes, the decoder holds %d" % (path, label, dtype, est, held))


for path in sys.argv[2:]:
    exact(path)
    # Tensor parallel 2: the split tensors at half, the rest whole.
    st = SafetensorsFile(path + "/model.safetensors")
    split = sum(4 * torch.Size(e["shape"]).numel() for n, e in st.header.items()
                if ".".join(n.split(".")[-2:]) in tp.ROWS | tp.COLS or n.endswith("lm_head.weight"))
    one, two = fit.need(path, torch.float32), fit.need(path, torch.float32, 2)
    ok(split > 0 and two == one - split // 2, "%s: tp 2 needs %d, want %d - %d/2" % (path, two, one, split))

# What the decoder does not read does not count: the same weights again
# in another file (with and without an index naming the files to read),
# and a stored lm_head the config ties to the embeddings.
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

src = sys.argv[2]  # a checkpoint with its own lm_head (untied)
with tempfile.TemporaryDirectory() as tmp:
    d = os.path.join(tmp, "m")
    shutil.copytree(src, d)
    shutil.copy(os.path.join(d, "model.safetensors"), os.path.join(d, "consolidated.safetensors"))
    exact(d, " with a second copy of its weights")
    names = SafetensorsFile(os.path.join(d, "model.safetensors")).header
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {n: "model.safetensors" for n in names}}, f)
    exact(d, " with an index")
    cfg = json.load(open(os.path.join(d, "config.json")))
    ok(not cfg.get("tie_word_embeddings") and "lm_head.weight" in names, "%s: want an untied checkpoint with lm_head" % src)
    cfg["tie_word_embeddings"] = True
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    exact(d, " tied, its lm_head stored")

try:
    fit.check(141 * 10**9, 80 * 10**9, torch.device("cuda", 0), 1)
    ok(False, "141 GB of weights passed 80 GB free")
except ProtocolError as e:
    msg = str(e)
    ok(e.code == OUT_OF_MEMORY and "141.0 GB on one GPU" in msg and "80.0 GB free" in msg and "tensor parallel" in msg, msg)
try:
    fit.check(36 * 10**9, 30 * 10**9, torch.device("cuda", 1), 4)
    ok(False, "36 GB a GPU passed 30 GB free")
except ProtocolError as e:
    ok("each of 4 GPUs (tensor parallel 4)" in str(e) and "cuda:1" in str(e), str(e))
fit.check(35 * 10**9, 80 * 10**9, torch.device("cuda", 0), 4)
ok(True, "")

# A GPU worker's torch CPU threads (backend.py): one once a model runs on a
# GPU, every core again while a later model loads, and --threads wins.
from mlxsworker.settings import Settings  # noqa: E402
from mlxsworker.torchrt.backend import TorchBackend  # noqa: E402

torch.set_num_threads(2)
b = TorchBackend(Settings())
b._gpu_threads(torch.device("cpu"))
ok(torch.get_num_threads() == 2, "a CPU model changed the threads to %d" % torch.get_num_threads())
b._gpu_threads(torch.device("cuda", 0))
ok(torch.get_num_threads() == 1, "a GPU model left %d threads" % torch.get_num_threads())
seen = []
real = fit.check_device
fit.check_device = lambda *a: seen.append(torch.get_num_threads())  # runs inside the load, before the weights
try:
    b.load(sys.argv[2], {"device": "cpu", "max_batch": 4})
finally:
    fit.check_device = real
ok(seen == [2] and torch.get_num_threads() == 1, "threads during a later load %s, after %d" % (seen, torch.get_num_threads()))
torch.set_num_threads(2)
b = TorchBackend(Settings())
b.set_threads(3)
b._gpu_threads(torch.device("cuda", 0))
ok(torch.get_num_threads() == 3, "--threads 3 became %d on a GPU model" % torch.get_num_threads())
print("%d passed, 0 failed" % passed)

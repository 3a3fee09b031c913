"""Whether a checkpoint's weights fit the GPU, checked before loading.

Without it a model too big for the device fails somewhere in the middle
of its load with torch's "CUDA out of memory. Tried to allocate 448 MiB",
which names neither what the model needs nor what to do. need() adds up,
from the safetensors headers alone, the bytes the decoder will hold on
one device: floating-point tensors in the serving dtype, gpt-oss's MXFP4
experts as the dequantized weights they become, other quantized layouts
as stored; under tensor parallel the split projections and the output
head at 1/n (tp.py) and the rest whole. Only tensors the decoder reads
count: those model.safetensors.index.json maps, when there is one (a
repository may carry the same weights again in another layout, as
Mistral's consolidated.safetensors), each name once, no vision tower,
and no stored lm_head when the embeddings are tied.

It is exact for float checkpoints (testdata/fit_test.py) and a lower
bound for quantized ones (their zeros and scales, and weights a layout
dequantizes at load, such as FP8 experts, count as stored; -quantize fp8
counts every projection at one byte): the check refuses only a model
whose weights alone exceed the device's free memory, never one that
would load. Free memory counts what torch's allocator holds unused (a
model unloaded before), and under tensor parallel every rank takes the
smallest free memory of the group, so all refuse alike.
"""
import json
import os

import torch

from ..errors import OUT_OF_MEMORY, ProtocolError
from .st import SafetensorsFile
from .tp import COLS, ROWS

FLOATS = ("F32", "F16", "BF16", "F64")
SKIP = ("vision_tower.", "multi_modal_projector.", "vision_model.")


def _files(path):
    """{file: names to count or None (all)} of the checkpoint at path."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            wm = json.load(f).get("weight_map") or {}
        files = {}
        for name, file in wm.items():
            files.setdefault(file, set()).add(name)
        return files
    return {f: None for f in sorted(os.listdir(path)) if f.endswith(".safetensors")}


def need(path, dtype, tp_size=1, quantize=None, tie=False):
    """Bytes of the weights at path on one device (see the module doc);
    tie: the config ties the output head to the embeddings."""
    esize = torch.tensor([], dtype=dtype).element_size()
    total, seen = 0, set()
    for f, names in _files(path).items():
        st = SafetensorsFile(os.path.join(path, f))
        for name, e in st.header.items():
            if (names is not None and name not in names) or name in seen or any(s in name for s in SKIP):
                continue
            if tie and name.endswith("lm_head.weight"):
                continue
            seen.add(name)
            n = 1
            for d in e["shape"]:
                n *= d
            leaf = ".".join(name.split(".")[-2:])
            if name.endswith("self_attn.sinks"):  # gpt-oss's attention sinks stay float32 (decoder.py)
                b = 4 * n
            elif e["dtype"] in FLOATS:
                b = n * (1 if quantize == "fp8" and leaf.endswith("proj.weight") else esize)
            elif e["dtype"] == "U8" and name.endswith("_blocks"):  # MXFP4: two values a byte, dequantized at load
                b = 2 * n * esize
            elif e["dtype"] == "U8" and name.endswith("_scales"):  # folded into the dequantized weights
                b = 0
            else:
                start, end = e["data_offsets"]
                b = end - start
            if tp_size > 1 and (leaf in ROWS or leaf in COLS or name.endswith("lm_head.weight")):
                b = -(-b // tp_size)
            total += b
    return total


def check(need_bytes, free_bytes, device, tp_size):
    """Refuses (out_of_memory) weights of need_bytes a device where
    free_bytes are free, saying what they need and what would help."""
    if need_bytes <= free_bytes:
        return
    gb = 1e9
    where = "each of %d GPUs (tensor parallel %d)" % (tp_size, tp_size) if tp_size > 1 else "one GPU"
    raise ProtocolError(OUT_OF_MEMORY, "the weights need %.1f GB on %s; %s has %.1f GB free: split the model over more "
                        "GPUs (tensor parallel), serve a quantized checkpoint, or a smaller model"
                        % (need_bytes / gb, where, device, free_bytes / gb))


def check_device(path, cfg, dtype, device, shard, quantize):
    """check() against the CUDA device's free memory now (with what
    torch's allocator holds unused; shard: tp.Shard, whose group agrees
    on its smallest); nothing on other devices (the CPU's memory is the
    host's to manage)."""
    if device.type != "cuda":
        return
    free, _ = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    n = 1
    if shard is not None:
        free, n = shard.agree(free), shard.size
    check(need(path, dtype, n, quantize, cfg.tie), free, device, n)

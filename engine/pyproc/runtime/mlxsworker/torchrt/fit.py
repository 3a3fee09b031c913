"""Whether a checkpoint's weights fit the GPU, checked before loading.

Without it a model too big for the device fails somewhere in the middle
of its load with torch's "CUDA out of memory. Tried to allocate 448 MiB",
which names neither what the model needs nor what to do. need() adds up
the bytes the decoder will hold on one device from the safetensors
headers alone: floating-point tensors in the serving dtype, quantized
layouts as stored (FP8, packed int4 and their scales; -quantize fp8
counts the projections at one byte a value), under tensor parallel the
split projections and the output head at 1/n (tp.py) and the rest whole.
Tensors the text decoder never reads (a vision tower) are left out. The
check refuses only a model whose weights alone exceed the device's free
memory: one that fits its weights but not a useful KV pool still loads
and is sized by the pool (model.py).
"""
import os

import torch

from ..errors import OUT_OF_MEMORY, ProtocolError
from .st import SafetensorsFile
from .tp import COLS, ROWS

FLOATS = ("F32", "F16", "BF16", "F64")
SKIP = ("vision_tower.", "multi_modal_projector.", "vision_model.")


def need(path, dtype, tp_size=1, quantize=None):
    """Bytes of the weights at path on one device (see the module doc)."""
    esize = torch.tensor([], dtype=dtype).element_size()
    total = 0
    for f in sorted(os.listdir(path)):
        if not f.endswith(".safetensors"):
            continue
        st = SafetensorsFile(os.path.join(path, f))
        for name, e in st.header.items():
            if any(s in name for s in SKIP):
                continue
            n = 1
            for d in e["shape"]:
                n *= d
            leaf = ".".join(name.split(".")[-2:])
            if e["dtype"] in FLOATS:
                size = 1 if quantize == "fp8" and leaf.endswith("proj.weight") else esize
                b = n * size
            else:
                b, end = e["data_offsets"]
                b = end - b
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


def check_device(path, dtype, device, tp_size, quantize):
    """check() against the CUDA device's free memory now; nothing on
    other devices (the CPU's memory is the host's to manage)."""
    if device.type != "cuda":
        return
    free, _ = torch.cuda.mem_get_info(device)
    check(need(path, dtype, tp_size, quantize), free, device, tp_size)

"""How the paged KV pool stores keys and values: in the compute dtype
("auto"), or as float8 e4m3 ("fp8", load opts "kv_cache_dtype", as vLLM's
--kv-cache-dtype fp8), one byte an element, so the same memory holds
twice the tokens of bfloat16 (four times float32's).

FP8: each layer has a scale for its keys and one for its values (1.0, as
vLLM without calibration; a checkpoint's self_attn.k_scale and v_scale,
or the older kv_scale for both, where it carries them, as FP8 checkpoints
with a kv_cache_scheme do). A write stores e4m3(x / scale): x times the
float32 reciprocal of scale (how torch's CUDA division by a scalar
computes it, and the same in every path here, so the bytes agree), round
to nearest even, saturating at ±448. A read gives code * scale in float32,
rounded to the compute dtype. On CUDA the pool
is torch.float8_e4m3fn and the Triton kernels (kernels.py) convert in
registers; elsewhere (torch 1.13 has no float8) it holds the same bytes
as uint8 (quant.e4m3_encode) and reads them through the 256-entry table.
Index operations go through a uint8 view of the pool: torch lacks them
for float8 in some versions, and a byte is a byte.
"""
import torch

from ..errors import INVALID, CheckpointError, ProtocolError
from . import quant

KV_DTYPES = ("auto", "fp8")
FLOAT8 = getattr(torch, "float8_e4m3fn", None)  # an FP8 pool's dtype where torch has it (2.1+)


def parse(opt):
    """The load option "kv_cache_dtype": "auto" (also None or "") or "fp8";
    anything else is refused."""
    if opt in (None, "", "auto"):
        return "auto"
    if opt != "fp8":
        raise ProtocolError(INVALID, "kv_cache_dtype %r: want auto or fp8" % (opt,))
    return opt


def checkpoint_scales(ck, prefix, layers):
    """Each layer's (k_scale, v_scale) as the checkpoint ck carries them
    (prefix: where its layers are), 1.0 where it carries none. Raises
    CheckpointError for a scale that is not one positive finite number."""
    out = []
    for i in range(layers):
        a = prefix + "layers.%d.self_attn." % i
        both = _scale(ck, a + "kv_scale")
        out.append((_scale(ck, a + "k_scale", both), _scale(ck, a + "v_scale", both)))
    return out


def _scale(ck, name, default=1.0):
    if not ck.has(name):
        return default
    t = ck.get(name, None, torch.device("cpu"), torch.float32)
    if t.numel() != 1 or not bool(torch.isfinite(t).all()) or float(t.reshape(-1)[0]) <= 0:
        raise CheckpointError(ck.file_of(name), "a KV cache scale must be one positive finite number", name)
    return float(t.reshape(-1)[0])


class KVFormat:
    """The pool's storage: kind ("auto" or "fp8"), dtype the compute
    dtype, scales each layer's (k_scale, v_scale) (1.0 for "auto").
    storage is the pool's torch dtype and itemsize its bytes an
    element."""

    def __init__(self, kind, device, dtype, scales):
        self.fp8 = kind == "fp8"
        self.dtype, self.scales = dtype, scales
        self.storage = dtype
        self.table = None  # e4m3 values by byte, where the pool holds bytes
        if self.fp8:
            native = device.type == "cuda" and FLOAT8 is not None
            self.storage = FLOAT8 if native else torch.uint8
            if not native:
                self.table = quant.e4m3_values().to(device)
        self.itemsize = 1 if self.fp8 else torch.tensor([], dtype=dtype).element_size()

    @property
    def name(self):
        """The info's kv_cache_dtype: "fp8_e4m3" or the compute dtype."""
        return "fp8_e4m3" if self.fp8 else str(self.dtype).replace("torch.", "")

    def zeros(self, shape, device):
        """A zeroed pool tensor."""
        return zeros(shape, device, self.storage)

    def encode(self, x, scale):
        """x as the pool stores it."""
        if not self.fp8:
            return x
        y = x.float() * (1.0 / scale)
        if self.table is not None:
            return quant.e4m3_encode(y)
        return y.clamp(-quant.E4M3_MAX, quant.E4M3_MAX).to(self.storage)

    def decode(self, codes, scale):
        """Stored values as the compute dtype."""
        if not self.fp8:
            return codes
        if self.table is not None:
            return (self.table[codes.long()] * scale).to(self.dtype)
        return (codes.float() * scale).to(self.dtype)

    def rounded(self, x, scale):
        """x through the pool and back: what a read of it gives."""
        return x if not self.fp8 else self.decode(self.encode(x, scale), scale)

    def store(self, cache, index, x, scale):
        """cache[index] = x, encoded."""
        if not self.fp8:
            cache[index] = x
            return
        _bytes(cache)[index] = _bytes(self.encode(x, scale))

    def load(self, cache, index, scale):
        """cache[index], decoded to the compute dtype."""
        if not self.fp8:
            return cache[index]
        return self.decode(_bytes(cache)[index].view(self.storage), scale)


def zeros(shape, device, dtype):
    """Zeros of dtype, float8 ones through a byte view (torch lacks
    zeros of float8 in some versions; the e4m3 byte 0 is +0.0)."""
    if dtype == FLOAT8:
        return torch.zeros(shape, device=device, dtype=torch.uint8).view(dtype)
    return torch.zeros(shape, device=device, dtype=dtype)


def _bytes(t):
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)

"""Safetensors reading without the safetensors package.

A file is an 8-byte little-endian header length, a JSON header mapping
tensor names to dtype, shape and byte offsets, then the raw data. The data is
memory-mapped copy-on-write and viewed with torch.frombuffer; bfloat16 is
read as int16 and reinterpreted, which works on torch 1.13 too.
"""
import mmap
import os

import torch

from ..errors import CheckpointError
from ..stcheck import open_header

DTYPES = {
    "F32": (torch.float32, torch.float32, 4),
    "F16": (torch.float16, torch.float16, 2),
    "BF16": (torch.int16, torch.bfloat16, 2),
    "F64": (torch.float64, torch.float64, 8),
    "I64": (torch.int64, torch.int64, 8),
    "I32": (torch.int32, torch.int32, 4),
    # Float8 e4m3fn read as bytes: torch 1.13 has no float8 dtype, and the
    # quantized layouts (quant.py) convert them themselves.
    "F8_E4M3": (torch.uint8, torch.uint8, 1),
    # Bytes: gpt_oss's MXFP4 blocks and scales (gptoss.py).
    "U8": (torch.uint8, torch.uint8, 1),
}


class SafetensorsFile:
    """One .safetensors file: its header, and tensors on demand. Every size
    and offset is checked against the file before anything is read or
    mapped, so a crafted file gives a CheckpointError."""

    def __init__(self, path):
        self.path = path
        name = os.path.basename(path)
        try:
            f = open(path, "rb")
        except OSError as e:
            raise CheckpointError(name, "cannot open: %s" % e.strerror)
        with f:
            self.header, self.base, data = open_header(f, name, DTYPES)
            self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if data > 0 else None
        self.name = name

    def shape(self, tname):
        return list(self.header[tname]["shape"])

    def dtype(self, tname):
        return DTYPES[self.header[tname]["dtype"]][1]

    def tensor(self, tname):
        e = self.header[tname]
        raw_dtype, dtype, size = DTYPES[e["dtype"]]
        b, end = e["data_offsets"]
        count = (end - b) // size
        if count == 0:
            return torch.empty(e["shape"], dtype=dtype)
        t = torch.frombuffer(self.mm, dtype=raw_dtype, count=count, offset=self.base + b)
        if raw_dtype != dtype:
            t = t.view(dtype)
        return t.view(e["shape"])


class Checkpoint:
    """All *.safetensors files of a directory, as one name space."""

    def __init__(self, directory):
        files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
        if not files:
            raise CheckpointError(".", "no *.safetensors file")
        self.where = {}
        for f in files:
            st = SafetensorsFile(os.path.join(directory, f))
            for tname in st.header:
                self.where[tname] = st

    def has(self, tname):
        return tname in self.where

    def stored_dtype(self, tname):
        """The tensor's safetensors dtype name (F32, F8_E4M3, ...)."""
        return self.where[tname].header[tname]["dtype"]

    def file_of(self, tname):
        st = self.where.get(tname)
        return st.name if st is not None else "model.safetensors"

    def _tensor(self, tname, shape):
        """The stored tensor tname, its shape checked against shape (None:
        any shape)."""
        st = self.where.get(tname)
        if st is None:
            raise CheckpointError("model.safetensors", "missing tensor", tname)
        got = st.shape(tname)
        if shape is not None and got != list(shape):
            raise CheckpointError(st.name, "shape %r contradicts config.json (want %r)" % (got, list(shape)), tname)
        return st.tensor(tname)

    def raw(self, tname, shape, device):
        """The tensor as stored (F8_E4M3 as uint8), copied to device;
        shape None takes any shape."""
        return self._tensor(tname, shape).to(device=device, copy=True)

    def get(self, tname, shape, device, dtype):
        return self._tensor(tname, shape).to(device=device, dtype=dtype, copy=True)

    def part(self, tname, shape, dim, start, n, device, dtype):
        """Positions start .. start+n-1 along dim of the tensor (whole
        shape checked as get checks it), copied to device: only that
        slice is read from the file (tensor parallel shards, tp.py)."""
        return self._tensor(tname, shape).narrow(dim, start, n).to(device=device, dtype=dtype, copy=True).contiguous()

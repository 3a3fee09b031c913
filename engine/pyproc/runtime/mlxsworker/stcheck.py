"""Checks of untrusted checkpoint files that need no torch: safetensors
headers (every size and offset against the file) and JSON side files of
bounded size. Used by the torch and the mlx backends before they read a
byte of weights."""
import json
import os
import struct

from .errors import CheckpointError

# dtype -> (bytes per element,)
DTYPE_SIZES = {"F64": (8,), "I64": (8,), "U64": (8,), "F32": (4,), "I32": (4,), "U32": (4,),
               "F16": (2,), "BF16": (2,), "I16": (2,), "U16": (2,), "I8": (1,), "U8": (1,), "BOOL": (1,)}
MAX_JSON = 4 << 20
MAX_HEADER = 100 << 20
MAX_DIMS = 8


def _int(v):
    """v if it is a JSON integer (not a bool), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def check_entry(e, data, dtypes):
    """The reason a header entry is bad, or None. data: bytes after the
    header; dtypes: name -> (..., bytes per element) as the last item."""
    if not isinstance(e, dict):
        return "header entry is not an object"
    dtype, shape, offsets = e.get("dtype"), e.get("shape"), e.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in dtypes:
        return "unsupported dtype %r" % (dtype,)
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or any(_int(d) is None or d < 0 for d in shape):
        return "bad shape %r" % (shape,)
    if not isinstance(offsets, list) or len(offsets) != 2 or any(_int(o) is None for o in offsets):
        return "bad data_offsets %r" % (offsets,)
    b, end = offsets
    if b < 0 or end < b or end > data:
        return "data offsets %r outside the %d data bytes (truncated file?)" % (offsets, data)
    numel = 1
    for d in shape:
        numel *= d
    if end - b != numel * dtypes[dtype][-1]:
        return "data offsets %r do not fit shape %r" % (offsets, shape)
    return None


def parse_header(raw, data, name, dtypes=None):
    """Checks a header's JSON bytes against the data size; returns the
    tensor entries. Raises CheckpointError."""
    dtypes = dtypes or DTYPE_SIZES
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise CheckpointError(name, "header is not JSON: %s" % e)
    if not isinstance(header, dict):
        raise CheckpointError(name, "header is not a JSON object")
    header.pop("__metadata__", None)
    spans = []
    for tname, e in header.items():
        reason = check_entry(e, data, dtypes)
        if reason:
            raise CheckpointError(name, reason, tname)
        b, end = e["data_offsets"]
        if end > b:
            spans.append((b, end, tname))
    spans.sort()
    for (_, prev_end, prev), (b, _, tname) in zip(spans, spans[1:]):
        if b < prev_end:
            raise CheckpointError(name, "data overlaps tensor %r" % prev, tname)
    return header


def open_header(f, name, dtypes=None):
    """Reads and checks the header of the safetensors file open as f (name
    its file name in errors). Returns the tensor entries, the offset of
    the data and its size in bytes."""
    raw = f.read(8)
    if len(raw) != 8:
        raise CheckpointError(name, "file too short for a safetensors header")
    (n,) = struct.unpack("<Q", raw)
    size = os.fstat(f.fileno()).st_size
    if n > size - 8 or n > MAX_HEADER:
        raise CheckpointError(name, "header length %d exceeds the file" % n)
    return parse_header(f.read(n), size - 8 - n, name, dtypes), 8 + n, size - 8 - n


def read_header(path):
    """Checks the header of the safetensors file at path."""
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            return open_header(f, name)[0]
    except OSError as e:
        raise CheckpointError(name, "cannot open: %s" % e.strerror)


def read_json(path, name):
    """A JSON object from a side file (config.json) of at most MAX_JSON bytes."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_JSON + 1)
    except OSError as e:
        raise CheckpointError(name, "cannot read: %s" % e.strerror)
    if len(raw) > MAX_JSON:
        raise CheckpointError(name, "larger than %d bytes" % MAX_JSON)
    try:
        c = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise CheckpointError(name, "not JSON: %s" % e)
    if not isinstance(c, dict):
        raise CheckpointError(name, "not a JSON object")
    return c

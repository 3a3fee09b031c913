"""quantization_config as published: scheme() parses it into a Scheme and
refuses, naming the field, what the engine cannot run. The layouts each
method stores, and how the engine serves them, are in quant.py's
docstring.
"""
from ..errors import INVALID, CheckpointError, ProtocolError

GROUPS = (32, 64, 128)  # the int4 group sizes served


class Scheme:
    """A parsed quantization_config. kind: "fp8", "int4" or "mxfp4"; method: the
    quant_method; block: FP8 (bn, bk) or None (scales per tensor or
    channel); group: int4 group size; zero_offset: added to GPTQ's stored
    zeros; asym: compressed-tensors int4 with weight_zero_point (false:
    the zero is 8)."""

    def __init__(self, kind, method, block=None, group=0, zero_offset=0, asym=False):
        self.kind, self.method, self.block, self.group = kind, method, block, group
        self.zero_offset, self.asym = zero_offset, asym


def scheme(top):
    """The Scheme of config.json (top: the whole file), None when it has no
    quantization_config. Refuses with a CheckpointError naming the field
    what the engine cannot run."""
    q = top.get("quantization_config")
    if q is None:
        tc = top.get("text_config")
        q = tc.get("quantization_config") if isinstance(tc, dict) else None
    if q is None:
        return None
    if not isinstance(q, dict):
        raise _bad("quantization_config", q, "an object")
    method = q.get("quant_method")
    if method == "fp8":
        if q.get("fmt", "e4m3") != "e4m3":
            raise _bad("fmt", q.get("fmt"), "e4m3")
        return Scheme("fp8", method, block=_block(q.get("weight_block_size"), "weight_block_size"))
    if method == "compressed-tensors":
        return _compressed(q)
    if method in ("awq", "gptq"):
        if q.get("bits") != 4:
            raise _bad("bits", q.get("bits"), "4")
        g = q.get("group_size", 128 if method == "awq" else None)
        if g not in GROUPS:
            raise _bad("group_size", g, " or ".join(map(str, GROUPS)))
        if method == "awq":
            if str(q.get("version", "gemm")).lower() != "gemm":
                raise _bad("version", q.get("version"), "gemm (AutoAWQ's GEMM packing)")
            if q.get("zero_point", True) is not True:
                raise _bad("zero_point", q.get("zero_point"), "true")
            return Scheme("int4", method, group=g)
        fmt = q.get("checkpoint_format", "gptq")
        if fmt not in ("gptq", "gptq_v2"):
            raise _bad("checkpoint_format", fmt, "gptq (auto-gptq's v1 zeros) or gptq_v2 (GPTQModel's)")
        if q.get("is_marlin_format", False) is not False:
            raise _bad("is_marlin_format", q.get("is_marlin_format"), "false")
        if q.get("pack_dtype", "int32") != "int32":
            raise _bad("pack_dtype", q.get("pack_dtype"), "int32")
        # desc_act either way: g_idx tells each input's group.
        return Scheme("int4", method, group=g, zero_offset=1 if fmt == "gptq" else 0)
    if method == "mxfp4":  # gpt_oss's experts, dequantized at load (gptoss.py); config.py checks the family
        return Scheme("mxfp4", method)
    raise _bad("quant_method", method, "fp8, compressed-tensors, awq, gptq or mxfp4 (gpt_oss)")


def _bad(field, got, want):
    return CheckpointError("config.json", "quantization_config.%s %r: unsupported (want %s)" % (field, got, want))


def _block(b, field):
    if b is None:
        return None
    if not (isinstance(b, list) and len(b) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 and x % 16 == 0 for x in b)):
        raise _bad(field, b, "two positive multiples of 16")
    return tuple(b)


def _compressed(q):
    sp = q.get("sparsity_config")
    if isinstance(sp, dict) and sp.get("format") not in (None, "dense"):
        raise _bad("sparsity_config.format", sp.get("format"), "dense (sparse-compressed weights are not supported)")
    fmt = q.get("format")
    if fmt not in ("float-quantized", "pack-quantized"):
        raise _bad("format", fmt, "float-quantized (FP8) or pack-quantized (int4)")
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise _bad("config_groups", groups, "an object of quantization groups")
    schemes = set()
    for name, g in sorted(groups.items()):
        w = g.get("weights") if isinstance(g, dict) else None
        if not isinstance(w, dict):
            raise _bad("config_groups.%s.weights" % name, w, "an object")
        if w.get("dynamic", False):
            raise _bad("config_groups.%s.weights.dynamic" % name, w.get("dynamic"), "false")
        schemes.add(_packed_group(name, g, w) if fmt == "pack-quantized" else _float_group(name, w))
    if len(schemes) != 1:
        raise _bad("config_groups", "of different weight schemes", "one scheme for every group")
    kind, block, group, asym = schemes.pop()
    return Scheme(kind, "compressed-tensors", block=block, group=group, asym=asym)


def _float_group(name, w):
    """The (kind, block, group, asym) of a float-quantized group's weights."""
    for field, want in (("num_bits", 8), ("type", "float"), ("symmetric", True)):
        if w.get(field) != want:
            raise _bad("config_groups.%s.weights.%s" % (name, field), w.get(field), repr(want))
    strategy = w.get("strategy")
    if strategy == "block":
        return "fp8", _block(w.get("block_structure"), "config_groups.%s.weights.block_structure" % name), 0, False
    if strategy not in ("tensor", "channel"):
        raise _bad("config_groups.%s.weights.strategy" % name, strategy, "tensor, channel or block")
    return "fp8", None, 0, False


def _packed_group(name, g, w):
    """The (kind, block, group, asym) of a pack-quantized group (weight-only
    int4 in groups along the input)."""
    field = "config_groups.%s.weights" % name
    if w.get("type") != "int" or w.get("num_bits") != 4:
        raise CheckpointError("config.json", "quantization_config.format pack-quantized with %s type %r, num_bits %r: "
                              "unsupported (want 4-bit int)" % (field, w.get("type"), w.get("num_bits")))
    if w.get("strategy") != "group":
        raise _bad(field + ".strategy", w.get("strategy"), "group")
    if w.get("group_size") not in GROUPS or isinstance(w.get("group_size"), bool):
        raise _bad(field + ".group_size", w.get("group_size"), " or ".join(map(str, GROUPS)))
    if w.get("actorder") not in (None, False, True, "weight", "static", "group", "dynamic"):
        raise _bad(field + ".actorder", w.get("actorder"), "null, weight, static, group or dynamic")
    if g.get("input_activations") is not None:  # W4A8 and the like
        raise _bad("config_groups.%s.input_activations" % name, g.get("input_activations"), "null (weight-only int4)")
    return "int4", None, w["group_size"], w.get("symmetric", True) is False


def parse_quantize(opt, sch):
    """The load option "quantize": None or "fp8"."""
    if opt in (None, "", "none"):
        return None
    if opt != "fp8":
        raise ProtocolError(INVALID, "quantize %r: want fp8" % (opt,))
    if sch is not None:
        raise ProtocolError(INVALID, "quantize fp8: the checkpoint is already quantized (%s)" % sch.method)
    return opt

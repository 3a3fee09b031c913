"""The FP8 KV cache (runtime/mlxsworker/torchrt/kvcache.py, load opts
"kv_cache_dtype": "fp8").

On the CPU:
- the e4m3 bytes the pool stores: every value to its own code, midpoints
  to the even one, saturation, signed zero, and agreement with this
  script's own nearest-value search (and with torch's float8_e4m3fn
  conversion where torch has it);
- a model with the FP8 pool samples exactly what the same model with a
  float32 pool samples when every key and value it writes is rounded
  through e4m3 (x / scale, nearest, ties to even, saturating, times
  scale) by this script's rounding: greedy tokens and logprobs, over
  prompt chunks (one continuing its prefix), decodes and a prefix reused
  from a saved sequence, on the plain torch path and on the CUDA path's
  code with the kernels stood in by plain torch (standins.py) and the
  prompt steps on the prompt-step graphs (prefill.py); the
  scales come from the checkpoint (self_attn.k_scale and v_scale, written
  beside the weights here), and without the rounding the logprobs differ;
- a pool sized from memory holds 4x the tokens of a float32 pool and 2x
  those of a bfloat16 one in the same bytes; the info says fp8_e4m3;
- an unknown kv_cache_dtype is refused (invalid_value), and so is a
  checkpoint scale that is not one positive finite number.

With --cuda (CUDA and Triton only): the Triton kernels write the bytes
torch's float8_e4m3fn conversion gives and their decode attention over an
FP8 pool agrees with plain torch over the dequantized pool; and a model
served on CUDA with the FP8 pool (Triton kernels, decode graphs, varlen
prompt attention, prompt-step graphs) samples what the CPU's emulated FP8
pool samples: tokens equal up to a near tie and logprobs within a
tolerance, 0.1 in bfloat16 (its rounding over the layers) and 0.01 in
float32 (a key or value within float32 noise of an e4m3 rounding boundary
may round the other way); a near tie is a reference top two within the
tolerance.

  python3 kvcache_test.py RUNTIME_DIR [--cuda] MODEL_DIR...

Prints "N passed, 0 failed" or raises. Run by TestKVCacheFP8 and
TestKVCacheFP8CUDA.
"""
import json
import os
import shutil
import struct
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ beside the runtime or in testdata
sys.path.insert(0, sys.argv[1])  # the runtime; standins.py is beside this script

import torch  # noqa: E402

from mlxsworker.errors import INVALID, CheckpointError, ProtocolError  # noqa: E402
from mlxsworker.settings import Settings  # noqa: E402
from mlxsworker.torchrt import decoder, graphs, kvcache, prefill, quant  # noqa: E402
from mlxsworker.torchrt.config import Config  # noqa: E402
from mlxsworker.torchrt import model as torchmodel  # noqa: E402
from mlxsworker.torchrt.model import TorchModel  # noqa: E402
from standins import Kern, flash_varlen, record  # noqa: E402

passed = 0


def check(cond, what):
    global passed
    if not cond:
        raise AssertionError(what)
    passed += 1


# -- e4m3 ------------------------------------------------------------------

TABLE = quant.e4m3_values()
FINITE = TABLE[:0x7F]  # 0 .. 448, increasing


def nearest_e4m3(x):
    """x (float32) rounded to e4m3 by searching every value: the nearest,
    of two the one with the even code, saturating at ±448."""
    a = x.abs().clamp(max=448.0).unsqueeze(-1)
    d = (a - FINITE).abs()
    near = d == d.min(-1, keepdim=True).values
    even = near & (torch.arange(FINITE.numel()) % 2 == 0)
    code = torch.where(even.any(-1), even.float().argmax(-1), near.float().argmax(-1))
    return torch.where(x < 0, -FINITE[code], FINITE[code])


def check_encoding():
    codes = torch.arange(0x7F)
    check(torch.equal(quant.e4m3_encode(FINITE), codes.to(torch.uint8)), "every finite value encodes to its code")
    check(torch.equal(quant.e4m3_encode(-FINITE), (codes | 0x80).to(torch.uint8)), "negative values set the sign bit")
    mid = (FINITE[:-1] + FINITE[1:]) / 2
    even = torch.where(codes[:-1] % 2 == 0, codes[:-1], codes[1:])
    check(torch.equal(quant.e4m3_encode(mid), even.to(torch.uint8)), "midpoints encode to the even code")
    check(quant.e4m3_encode(torch.tensor([1e9, -1e9, -0.0, -1e-9])).tolist() == [0x7E, 0xFE, 0x80, 0x80],
          "saturates at ±448; zero keeps its sign")
    x = torch.randn(20000, generator=torch.Generator().manual_seed(5)) * torch.logspace(-4, 3, 20000)
    check(torch.equal(TABLE[quant.e4m3_encode(x).long()], nearest_e4m3(x)), "codes decode to the nearest value")
    if kvcache.FLOAT8 is not None:  # torch 2.1+
        want = x.clamp(-448, 448).to(kvcache.FLOAT8).view(torch.uint8)
        check(torch.equal(quant.e4m3_encode(x), want), "bit for bit torch's float8_e4m3fn conversion")


# -- models ----------------------------------------------------------------

class Rounded(kvcache.KVFormat):
    """The reference pool: float32, every value written as this script
    rounds it (nearest_e4m3(x / scale) * scale, the division as x times
    the float32 reciprocal, as kvcache.py defines it)."""

    def __init__(self, scales):
        super().__init__("auto", torch.device("cpu"), torch.float32, scales)

    def store(self, cache, index, x, scale):
        cache[index] = self.rounded(x, scale)

    def rounded(self, x, scale):
        return nearest_e4m3(x.float() * (1.0 / scale)) * scale


def layer_prefix(path):
    """Where the checkpoint's layers are ("model.layers.", ...)."""
    with open(os.path.join(path, "model.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        names = json.loads(f.read(n))
    q = next(k for k in names if k.endswith("layers.0.self_attn.q_proj.weight") or k.endswith("layers.0.self_attn.qkv_proj.weight"))
    return q[: q.index("layers.0.")] + "layers."


def write_f32(path, tensors):
    """A safetensors file of float32 scalars (name -> value)."""
    header, data = {}, b""
    for name, v in tensors.items():
        header[name] = {"dtype": "F32", "shape": [], "data_offsets": [len(data), len(data) + 4]}
        data += struct.pack("<f", v)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def with_scales(path, tmp, scales):
    """A copy of the checkpoint at path carrying each layer's k_scale and
    v_scale (scales: [(k, v)]) in a file of its own."""
    out = os.path.join(tempfile.mkdtemp(dir=tmp), os.path.basename(path))
    shutil.copytree(path, out)
    pre = layer_prefix(path)
    t = {}
    for i, (k, v) in enumerate(scales):
        t[pre + "%d.self_attn.k_scale" % i] = k
        t[pre + "%d.self_attn.v_scale" % i] = v
    write_f32(os.path.join(out, "kv_scales.safetensors"), t)
    return out


def load(path, fp8, emulate, device="cpu", dtype="float32", settings=None):
    """The model at path (fp8: with the FP8 pool); emulate: the CUDA path's
    code on the CPU, its kernels stood in by plain torch, prompt steps on
    the prompt-step graphs (each piece run again at every replay)."""
    opts = {"device": device, "dtype": dtype, "max_batch": 8}
    if fp8:
        opts["kv_cache_dtype"] = "fp8"
    m = TorchModel(path, opts, settings)
    if emulate:
        m.model.kern = Kern(m.model)
        m.model.varlen = m.model.sdpa = True
        m.prefill = prefill.PrefillGraphs(m.model, m.kv, 512)
    return m


def scenario(m):
    """Seq 1's prompt in two chunks (the second continues its prefix)
    beside seq 2's; decodes; seq 2 is saved under a key and seq 3 reuses
    its KV; decodes. Returns ([(token, logprob, gap)], tokens reused)."""
    p1 = [(j * 37 + 11) % 300 + 5 for j in range(70)]
    p2 = [(j * 53 + 7) % 300 + 5 for j in range(45)]
    lp = {"l": True, "n": 2}
    out = []

    def step(batch):
        r = m.step(batch)
        out.extend((t, l, top[0][1] - top[1][1]) for t, l, top in zip(r.tokens, r.logprobs, r.top))
        return r.tokens

    with torch.no_grad():
        m.open(1, p1, "")
        m.open(2, p2, "")
        t = step([[1, p1[:40], False, lp], [2, p2, True, lp]])
        t = step([[1, p1[40:], True, lp]]) + t
        last, fed2 = {1: t[0], 2: t[1]}, list(p2)
        for _ in range(4):
            fed2.append(last[2])
            t = step([[i, [last[i]], True, lp] for i in (1, 2)])
            last = dict(zip((1, 2), t))
        m.free(2, "saved")
        p3 = fed2 + [7, 8, 9]
        reused = m.open(3, p3, "saved")
        last[3] = step([[3, p3[reused:], True, lp]])[0]
        for _ in range(4):
            t = step([[i, [last[i]], True, lp] for i in (1, 3)])
            last = dict(zip((1, 3), t))
    return out, reused


def worst(a, b):
    return max(abs(x[1] - y[1]) for x, y in zip(a, b))


def check_model(path, tmp):
    """FP8 against the rounding reference on one checkpoint, with the
    checkpoint's scales, on both CPU paths."""
    L = Config(path).layers
    scales = [(0.02 * (i + 1), 0.05 + 0.01 * i) for i in range(L)]
    scaled = with_scales(path, tmp, scales)
    for emulate in (False, True):
        fp8 = load(scaled, True, emulate)
        check(fp8.kv.k.dtype == torch.uint8 and fp8.info()["kv_cache_dtype"] == "fp8_e4m3", "the CPU pool holds e4m3 bytes")
        check([(round(k, 6), round(v, 6)) for k, v in fp8.model.kvq.scales] == [(round(k, 6), round(v, 6)) for k, v in scales],
              "the checkpoint's k_scale and v_scale are read")
        got, reused = scenario(fp8)
        check(reused > 0, "the saved prefix is reused")
        check(not emulate or fp8.prefill.sets, "the prompt-step graphs ran")
        ref_m = load(scaled, False, emulate)
        ref_m.model.kvq = Rounded(scales)
        ref, _ = scenario(ref_m)
        plain, _ = scenario(load(scaled, False, emulate))
        what = "%s (%s)" % (path, "emulated CUDA path" if emulate else "torch path")
        check([t for t, _, _ in got] == [t for t, _, _ in ref], "%s: tokens %r, reference %r" % (what, got, ref))
        check(worst(got, ref) < 1e-5, "%s: logprobs differ from the reference by %g" % (what, worst(got, ref)))
        check(worst(plain, ref) > 1e-5, "%s: the rounding changes nothing: the check is vacuous" % what)
        print("%s: %d tokens as the rounding reference (%g); unrounded pool differs by %.3g"
              % (what, len(got), worst(got, ref), worst(plain, ref)))


def check_capacity(path):
    """Pools sized from the same memory: 4x float32's tokens, 2x bfloat16's."""
    saved = torchmodel.CPU_KV_BYTES
    torchmodel.CPU_KV_BYTES = 1 << 20
    try:
        for dtype, ratio in (("float32", 4), ("bfloat16", 2)):
            opts = {"device": "cpu", "dtype": dtype, "max_batch": 256}
            plain = TorchModel(path, opts)
            fp8 = TorchModel(path, dict(opts, kv_cache_dtype="fp8"))
            a, b = plain.info(), fp8.info()
            check(a["kv_cache_dtype"] == dtype and b["kv_cache_dtype"] == "fp8_e4m3", "info: %s, %s" % (a["kv_cache_dtype"], b["kv_cache_dtype"]))
            row = plain.kv.bs * ratio  # the last block row may not fit either way
            check(abs(b["kv_capacity"] - ratio * a["kv_capacity"]) < row,
                  "%s: %d tokens in FP8, %d in %s: want %dx" % (path, b["kv_capacity"], a["kv_capacity"], dtype, ratio))
            for d in (a, b):  # the scratch block comes on top
                check(d["kv_bytes"] * d["kv_blocks"] // (d["kv_blocks"] + 1) <= 1 << 20, "the pool outgrows the memory: %r" % d)
            print("%s: %d tokens in %s, %d in FP8, %d bytes each at most" % (path, a["kv_capacity"], dtype, b["kv_capacity"], 1 << 20))
    finally:
        torchmodel.CPU_KV_BYTES = saved


def check_refusals(path, tmp):
    try:
        TorchModel(path, {"device": "cpu", "kv_cache_dtype": "bogus"})
        check(False, "kv_cache_dtype bogus: loaded")
    except ProtocolError as e:
        check(e.code == INVALID and "kv_cache_dtype" in str(e), "kv_cache_dtype bogus: %s" % e)
    bad = with_scales(path, tmp, [(-1.0, 1.0)] * Config(path).layers)
    try:
        TorchModel(bad, {"device": "cpu", "kv_cache_dtype": "fp8"})
        check(False, "a negative k_scale: loaded")
    except CheckpointError as e:
        check("k_scale" in e.tensor, "a negative k_scale: %s" % e)


# -- CUDA ------------------------------------------------------------------

def _steps(codes):
    """e4m3 bytes as signed steps from zero: +0 and -0 both 0."""
    c = codes.int()
    return torch.where(c >= 128, 128 - c, c)


def check_kernels():
    """rope_kv's FP8 bytes against torch's conversion; decode_attention
    over an FP8 pool against plain torch over the dequantized pool."""
    from mlxsworker.torchrt import kernels
    dev, dtype = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(0)
    H, K, hd, bs, B, nb = 8, 2, 64, 16, 3, 40
    ks, vs = 0.03, 0.5
    fmt = kvcache.KVFormat("fp8", dev, dtype, [(ks, vs)])
    kc, vc = (fmt.zeros((B * nb + 1, bs, K, hd), dev) for _ in "kv")
    qkv = torch.randn(B * nb * bs, (H + 2 * K) * hd, generator=g).to(dev, dtype)
    pos = torch.arange(nb * bs, device=dev).repeat(B)
    rows = torch.arange(B * nb * bs, device=dev)
    cos = torch.randn(nb * bs, hd, generator=g).to(dev, dtype)
    sin = torch.randn(nb * bs, hd, generator=g).to(dev, dtype)
    qk = kernels.rope_kv(qkv, kc, vc, rows, pos, cos, sin, H, K, None, ks, vs)
    want_k = fmt.encode(qk[:, H:], ks).view(torch.uint8)
    want_v = fmt.encode(qkv[:, (H + K) * hd :].reshape(-1, K, hd), vs).view(torch.uint8)
    got_k, got_v = kc.view(torch.uint8).view(-1, K, hd)[: B * nb * bs], vc.view(torch.uint8).view(-1, K, hd)[: B * nb * bs]
    # k's scale (0.03) makes x / scale inexact: on an H200, 3 of 245,760
    # k bytes landed one code from torch's (a product at a code boundary),
    # so k may differ by one code in 1 of 10,000 places. Codes compare as
    # signed steps from zero (e4m3 is sign and magnitude): +0 and -0 are
    # the same value, 128 apart as bytes, and the H200 wrote one where
    # torch wrote the other (45 of v's bytes in one run). v's scale is a
    # power of two: its values must match exactly.
    off = (_steps(got_k) - _steps(want_k)).abs()
    check(int(off.max()) <= 1 and int((off > 0).sum()) * 10000 <= off.numel(),
          "rope_kv: k bytes differ from torch's conversion in %d places (at most %d codes)" % (int((off > 0).sum()), int(off.max())))
    off_v = _steps(got_v) != _steps(want_v)
    check(not bool(off_v.any()), "rope_kv: v bytes differ from torch's conversion in %d places" % int(off_v.sum()))
    # Decode over the pool rope_kv wrote: sequence b's blocks scattered.
    perm = torch.randperm(B * nb, generator=g)
    table = torch.full((B + 1, nb), B * nb, dtype=torch.int32)
    table[1:] = perm.view(B, nb).to(torch.int32)
    kc2, vc2 = kc.clone(), vc.clone()
    kc2.view(torch.uint8)[perm.to(dev)] = kc.view(torch.uint8)[: B * nb]
    vc2.view(torch.uint8)[perm.to(dev)] = vc.view(torch.uint8)[: B * nb]
    table = table.to(dev)
    trows = torch.tensor([1, 2, 3], device=dev)
    p = torch.tensor([5, 300, nb * bs - 1], device=dev)
    step = torch.randn(B, (H + 2 * K) * hd, generator=g).to(dev, dtype)
    for window, context in ((0, nb * bs), (37, nb * bs), (0, 8192)):  # 8192: the cache split over programs
        k8, v8 = kc2.clone(), vc2.clone()
        out = kernels.decode_attention(step, k8, v8, table, trows, p, cos, sin, H, K, context, None, window, None, True, ks, vs)
        # Plain torch: the new token as torch converts it, the pool read as code * scale.
        at = table[trows, p // bs].long() * bs + p % bs
        qr = kernels.rope_kv(step, kc2.clone(), vc2.clone(), at, p, cos, sin, H, K, None, ks, vs)
        wrote = k8.view(torch.uint8).view(-1, K, hd)[at]
        check(torch.equal(wrote, fmt.encode(qr[:, H:], ks).view(torch.uint8)), "decode_attention: the new k's bytes")
        want = []
        for b in range(B):
            n = int(p[b]) + 1
            blocks = table[trows[b], : -(-n // bs)].long()
            kk = fmt.load(k8, blocks, ks).reshape(-1, K, hd)[:n]
            vv = fmt.load(v8, blocks, vs).reshape(-1, K, hd)[:n]
            lo = max(0, n - window) if window else 0
            kk, vv = kk[lo:].float().repeat_interleave(H // K, 1), vv[lo:].float().repeat_interleave(H // K, 1)
            s = torch.einsum("hd,lhd->hl", qr[b, :H].float(), kk) / hd ** 0.5
            want.append(torch.einsum("hl,lhd->hd", torch.softmax(s, -1), vv).reshape(-1))
        d = (out.float() - torch.stack(want)).abs().max().item()
        check(d < 2e-2, "decode_attention over FP8 (window %d, context %d) differs from torch by %g" % (window, context, d))


def check_cuda_model(path):
    """The CUDA FP8 model (every fast path on) against the CPU's emulated
    FP8 model (exact against the rounding reference above)."""
    ref, _ = scenario(load(path, True, False))
    # bfloat16 twice: prompt steps through varlen flash attention
    # (piecewise graphs), last through the paged prompt-attention kernel
    # (whole-step graphs), so a failure says which attention it was.
    # bfloat16's tolerance is Gemma 3's: its embeddings scaled by
    # sqrt(hidden) and sandwich norms round to bfloat16 about five times
    # Llama's error against float32 (on an H200: 0.089 with varlen
    # attention, 0.104 with the paged kernel; Llama 0.019 with either).
    runs = (("bfloat16", 0.15, Settings(prompt_attention=False)), ("float32", 0.01, Settings()), ("bfloat16", 0.15, Settings()))
    for dtype, tol, settings in runs:
        m = load(path, True, False, "cuda", dtype, settings)
        check(m.kv.k.dtype == kvcache.FLOAT8 and m.model.kern is not None, "%s: the FP8 pool and the kernels" % dtype)
        got, _ = scenario(m)
        dtype += "" if settings.prompt_attention else " (varlen prompt attention)"
        for i, (a, b) in enumerate(zip(got, ref)):
            if a[0] != b[0]:
                check(b[2] < tol, "%s %s: token %d is %d, reference %d (gap %.3f)" % (path, dtype, i, a[0], b[0], b[2]))
                break  # a near tie: the rest diverges
            check(abs(a[1] - b[1]) < tol, "%s %s: token %d logprob %.5f, reference %.5f" % (path, dtype, i, a[1], b[1]))
        check(m.graphs is not None and m.graphs.graphs and not m.graphs.broken, "%s %s: no decode graph ran" % (path, dtype))
        if dtype.startswith("bfloat16"):
            check(m.prefill is not None and m.prefill.sets, "%s %s: no prompt-step graph ran" % (path, dtype))
        print("%s %s: %d tokens, worst logprob difference %.3g" % (path, dtype, len(got), worst(got, ref)))


def main():
    args = sys.argv[2:]
    cuda = "--cuda" in args
    paths = [a for a in args if a != "--cuda"]
    if not cuda:
        decoder._flash_varlen = flash_varlen
        graphs.record, graphs.new_pool = record, lambda: object()
    if cuda:
        check_kernels()
        for path in paths:
            check_cuda_model(path)
    else:
        check_encoding()
        with tempfile.TemporaryDirectory() as tmp:
            for path in paths:
                check_model(path, tmp)
            check_capacity(paths[0])
            check_refusals(paths[0], tmp)
    print("%d passed, 0 failed" % passed)


main()

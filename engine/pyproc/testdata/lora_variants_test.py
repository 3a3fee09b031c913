"""lora_triton.variants against what Triton would compile, on the CPU:
Triton is replaced by a module whose kernels record each launch's
compile key instead of running (the values of the compile-time
arguments, num_warps and num_stages; for every other integer argument
not in the kernel's do_not_specialize, whether it is 1 and whether 16
divides it; for every tensor its dtype and 16-byte alignment), and
lora_triton.delta is launched for every row count from 1 to past where
the variants stop changing, over llama-like projection shapes at ranks
whose packed widths are and are not multiples of 16. Two row counts
must give equal variants exactly when their launches give equal keys:
a launch argument that changes with the rows without variants knowing
would compile mid-step, after lora.Slots.warm.

  python3 lora_variants_test.py RUNTIME_DIR

Prints "N passed, 0 failed" or raises. Run by TestLoRAKernelVariants.
"""
import inspect
import sys
import types

sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402


class Constexpr:
    """tl.constexpr: the annotation that marks compile-time arguments."""


LAUNCHES = []


class Kernel:
    """A jitted function: indexing it by a grid gives a launcher that
    records the launch's compile key."""

    def __init__(self, fn, do_not_specialize=()):
        self.fn, self.skip = fn, set(do_not_specialize)
        self.params = inspect.signature(fn).parameters

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            opts = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
            key = [self.fn.__name__, tuple(sorted(opts.items()))]
            for name, v in bound.arguments.items():
                if self.params[name].annotation is Constexpr:
                    key.append((name, v))
                elif isinstance(v, torch.Tensor):
                    key.append((name, str(v.dtype), v.data_ptr() % 16 == 0))
                elif isinstance(v, bool) or not isinstance(v, int):
                    key.append((name, v))
                elif name not in self.skip:
                    key.append((name, v == 1, v % 16 == 0))
            LAUNCHES.append(tuple(key))
        return launch


def jit(fn=None, do_not_specialize=(), **_):
    if fn is None:
        return lambda f: Kernel(f, do_not_specialize)
    return Kernel(fn)


def install():
    triton = types.ModuleType("triton")
    tl = types.ModuleType("triton.language")
    triton.language, triton.jit = tl, jit
    triton.cdiv = lambda a, b: -(-a // b)
    triton.next_power_of_2 = lambda n: 1 << (n - 1).bit_length()
    tl.constexpr = Constexpr
    sys.modules["triton"], sys.modules["triton.language"] = triton, tl


install()
from mlxsworker.torchrt import lora, lora_triton  # noqa: E402

# Projection shapes (input width, modules' output widths): an 8B llama's
# split q/k/v, gate/up and down.
SHAPES = [(4096, [4096, 1024, 1024]), (4096, [14336, 14336]), (14336, [4096])]


def keys_by_rows(width, outs, S, R, last, dtype):
    """{row count: (variants, the launches' keys)} for 1 .. last rows."""
    A = torch.zeros(S, len(outs), R, width, dtype=dtype)
    B = torch.zeros(S, R, sum(outs), dtype=dtype)
    off = lora.offsets([(None, o) for o in outs])
    key_ids = torch.arange(1, S + 2)
    xs = torch.zeros(last, width, dtype=dtype)
    y = torch.zeros(1, sum(outs), dtype=dtype)
    out = {}
    for n in range(1, last + 1):
        order, start, tiles = lora.segments(torch.zeros(n, dtype=torch.long), key_ids, lora_triton.ROW_TILES)
        del LAUNCHES[:]
        lora_triton.delta(y, xs[:n], A, B, off, order, start, tiles)
        out[n] = (lora_triton.variants(n, A, B, off), tuple(LAUNCHES))
    return out


def main():
    passed = 0
    last = 64 * lora_triton.PROGRAMS + 64  # past the last change (lora.Slots.warm)
    for width, outs in SHAPES:
        for R, dtype in ((16, torch.bfloat16), (24, torch.bfloat16), (64, torch.float32)):
            if len(outs) == 1 and R == 24:
                continue  # m R a multiple of 8 but not 16 needs an odd module count: split q/k/v covers it
            got = keys_by_rows(width, outs, 32, R, last, dtype)
            by_variant, by_key = {}, {}
            for n, (variant, launch) in got.items():
                if by_variant.setdefault(variant, launch) != launch:
                    raise AssertionError("%s rank %d: rows %d give variants %r of another rows' launches" % (outs, R, n, variant))
                if by_key.setdefault(launch, variant) != variant:
                    raise AssertionError("%s rank %d: rows %d launch kernels compiled for variants %r under %r" % (outs, R, n, by_key[launch], variant))
            assert len(by_variant) > 1, "no row count changed the variants: nothing tested"
            passed += 1
    print("%d passed, 0 failed" % passed)


main()

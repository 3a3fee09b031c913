"""Programmatic dependent launch (PDL) for the decode path's Triton kernels.

A decode step at a few sequences is a chain of about ten kernels a layer,
most of them a few microseconds long (the norms, SwiGLU, attention and its
combine) and the rest weight streams that a ramp and a tail make longer
than their bytes. Between two kernels of a stream the GPU normally drains
the first grid, flushes its writes and only then launches the next, and
no kernel runs in between (a chain of those kernels at one row, on an
H200: 0.64 us a boundary saved, testdata/pdl_test.py --bench). On
Hopper and later, a kernel launched with PDL (CUDA's programmatic stream
serialization, which CUDA graphs capture as programmatic edges) may
start while the one before it still runs: its programs are placed, and wait
(griddepcontrol.wait) until that kernel has completed and its writes are
visible. The kernel before lets its successor start early by
griddepcontrol.launch_dependents; without it the successor starts as the
last of its programs exits, still before the grid's completion.

Rules every kernel launched through args() keeps (its PDL constexpr):
- Every program calls wait() before its first load and its first
  store, programs with nothing to do included. So a kernel completes
  only after the one before it, and by induction after every earlier
  one: a kernel launched without PDL (cuBLAS, torch's own) still finds
  all earlier work done. (Loading a product's first weight tile before
  the wait was tried: its loop, carrying the next tile by hand, ran
  slower than Triton's pipelined one; BENCHMARKS.md.)
- release() comes where the kernel's successor may take SM room without
  slowing it: at the start of a kernel of a few programs, after the K
  loop of a product (its last wave's epilogue overlaps the next launch).

Which release a launch takes depends on its rows (measured on an H200,
8B shape, decode tok/s: BENCHMARKS.md). At one row the early releases
gain 1.06x over no PDL (FP8; GPTQ 1.05x), and at 2, 4 and 8 rows 1.01x
to 1.03x over releasing at exit. At 16 and 64 rows they lose to no PDL
(FP8 0.99x and 0.98x, GPTQ 0.90x at 64), where releasing at exit gains
(FP8 1.01x and 1.02x). So steps of up to ON_ROWS rows launch ON and
larger ones EXIT.

Off below sm_90 (no PDL), with a Triton that lacks the instructions,
and with MLXSERVING_PDL=0 in the worker's environment; MLXSERVING_PDL=exit
and =on take that mode at every row count (measurement). Read at import, so
one binary measures each; MODE may be set by a test before a launch.
"""
import os

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    _HAS = True
except ImportError:  # a Triton without the instructions: PDL stays off
    _HAS = False

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass


# The kernels' PDL constexpr: OFF, ON (wait, and release where the
# kernel says), EXIT (wait; the successor launches as programs exit).
# MODE AUTO: ON up to ON_ROWS rows, else EXIT.
OFF, ON, EXIT, AUTO = 0, 1, 2, 3
MODE = {"0": OFF, "on": ON, "exit": EXIT}.get(os.environ.get("MLXSERVING_PDL", ""), AUTO)
ON_ROWS = 8

_capable = {}


def args(device, rows):
    """The keywords a launch on device over rows rows adds: the kernel's
    PDL constexpr, and Triton's launch_pdl where PDL runs."""
    mode = MODE if _HAS and device.type == "cuda" else OFF
    if mode == AUTO:
        mode = ON if rows <= ON_ROWS else EXIT
    if mode != OFF and device not in _capable:
        _capable[device] = torch.cuda.get_device_capability(device)[0] >= 9
    if mode == OFF or not _capable[device]:
        return _OFF
    return _ARGS[mode]


_OFF = {"PDL": OFF}
_ARGS = {ON: {"PDL": ON, "launch_pdl": True}, EXIT: {"PDL": EXIT, "launch_pdl": True}}


@triton.jit
def wait(PDL: tl.constexpr):
    """Waits until the kernel before has completed and its writes are
    visible (nothing without PDL)."""
    if PDL != 0:
        gdc_wait()


@triton.jit
def release(PDL: tl.constexpr):
    """Lets the next kernel launch once every program of this one has
    passed here or exited (nothing unless PDL is ON)."""
    if PDL == 1:
        gdc_launch_dependents()

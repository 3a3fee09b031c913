"""Host-to-device copies that do not make the host wait for the GPU."""
import itertools
import operator
import time

import torch

from ..timing import device_wait
from ..trace import span


def to_device(values, dev, dtype=torch.long):
    """values (a list, nested lists or a CPU tensor) as a tensor on dev.
    On CUDA through pinned memory: a copy from pageable memory would wait
    for every kernel already queued (a split step's decode graph, say);
    the caching host allocator keeps the pinned buffer until the copy ran."""
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    dev = torch.device(dev)
    if dev.type != "cuda":
        return host.to(dev)
    return host.pin_memory().to(dev, non_blocking=True)


class HostCopy:
    """Device tensors copied to pinned host memory behind the work queued
    so far: get() waits for that work only, not for what is queued after
    the copy (CUDA; on the CPU a plain copy)."""

    def __init__(self, tensors):
        cuda = bool(tensors) and tensors[0].is_cuda
        self.host = []
        for t in tensors:
            h = torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda)
            h.copy_(t, non_blocking=cuda)
            self.host.append(h)
        self.event = None
        if cuda:
            self.event = torch.cuda.Event()
            self.event.record()

    def get(self):
        """The tensors as host lists."""
        if self.event is not None:
            t0 = time.perf_counter()
            with span("worker.device_wait"):
                self.event.synchronize()
            device_wait(time.perf_counter() - t0)
        return [h.tolist() for h in self.host]


# Fewer values of runs than this go through pack_ints as Python ints
# (~20 ns a value), more through expand_runs' torch ops (~20 us a call).
EXPAND_MIN = 512


def pack_ints(parts, starts, counts, n):
    """One CPU long tensor of parts (lists of ints) one after another,
    then the n values of the runs of starts and counts (expand_runs)."""
    chain = itertools.chain.from_iterable
    if n < EXPAND_MIN:
        runs = chain(map(range, starts, map(operator.add, starts, counts)))
        return torch.tensor(list(chain(parts + [runs])), dtype=torch.long)
    return torch.cat([torch.tensor(list(chain(parts)), dtype=torch.long), expand_runs(starts, counts, n)])


def expand_runs(starts, counts, n):
    """The runs start, start + 1, .. start + count - 1 of starts and
    counts, one after another (n values in all), as a CPU long tensor:
    a few torch ops a call, where building the values as Python ints
    costs ~20 ns each (a 2,048-token chunk's positions and KV rows ~80 us)."""
    sc = torch.tensor([starts, counts], dtype=torch.long)
    s, c = sc[0], sc[1]
    # Value i of run r is i less the values before the run, plus its start.
    shift = s - (c.cumsum(0) - c)
    return torch.arange(n) + shift.repeat_interleave(c, output_size=n)

"""Host-to-device copies that do not make the host wait for the GPU."""
import time

import torch

from ..timing import device_wait


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
            self.event.synchronize()
            device_wait(time.perf_counter() - t0)
        return [h.tolist() for h in self.host]

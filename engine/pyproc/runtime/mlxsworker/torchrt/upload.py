"""Host-to-device copies that do not make the host wait for the GPU."""
import torch


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

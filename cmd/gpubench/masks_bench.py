"""Times applying a step's allowed-token masks on the worker, per row:
the batched path (runtime/sampling.py: one packed bitset, one upload, one
masked_fill) against the per-row path it replaced (a bool tensor built on
the host per row, copied to the device, a masked_fill per row), for the
forms the supervisor sends: a free string's mask (nearly every id: "d"),
a random half (base64 bitset, "b") and a key position (a few ids: "a").

  python3 masks_bench.py RUNTIME_DIR [DEVICE] [VOCAB]

Prints one line per (form, rows): µs per row for each path, the best of
five rounds; "packed
bitset" is the batched path through the bitset upload, which the GPU
takes (on the CPU the batched path writes bool rows directly).
"""
import base64
import random
import sys
import time

sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402

from mlxsworker.torchrt import sampling  # noqa: E402


def per_row(x, width, device):
    """The mask decode this package used before the batched path."""
    if "a" in x:
        m = torch.zeros(width, dtype=torch.bool)
        m[torch.tensor(x["a"])] = True
    elif "d" in x:
        m = torch.ones(width, dtype=torch.bool)
        m[torch.tensor(x["d"])] = False
        m[int(x["v"]):] = False
    else:
        raw = torch.frombuffer(bytearray(base64.b64decode(x["b"])), dtype=torch.uint8)
        bits = ((raw.unsqueeze(1) >> torch.arange(8, dtype=torch.uint8)) & 1).flatten().bool()
        m = torch.zeros(width, dtype=torch.bool)
        n = min(width, bits.shape[0])
        m[:n] = bits[:n]
    return m.to(device)


def forms(rng, width):
    half = bytes(rng.randrange(256) for _ in range((width + 7) // 8))
    return {
        "string": {"d": sorted(rng.sample(range(width), width // 100)), "v": width},
        "half": {"b": base64.b64encode(half).decode()},
        "key": {"a": sorted(rng.sample(range(width), 12))},
    }


def timed(fn, sync, reps):
    """The best of five rounds of reps calls, per call (a shared machine's
    noise only ever adds)."""
    fn()
    sync()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def main():
    device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    width = int(sys.argv[3]) if len(sys.argv) > 3 else 128256
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    rng = random.Random(1)
    for name, x in forms(rng, width).items():
        for rows in (1, 16):
            logits = torch.randn(rows, width, device=device)
            items = [({"x": x}, None)] * rows

            def batched():
                sampling.apply_masks(logits, sampling.device_masks(items, width, device))

            def packed():
                sampling.apply_masks(logits, sampling.device_masks(items, width, device, packed=True))

            def rowwise():
                for r in range(rows):
                    logits[r].masked_fill_(~per_row(x, width, device), float("-inf"))

            reps = max(3, 100 // rows)
            b, k, p = timed(batched, sync, reps), timed(packed, sync, reps), timed(rowwise, sync, reps)
            print("%-6s rows=%-2d batched %7.1f µs/row (packed bitset %7.1f)   per-row %7.1f µs/row"
                  % (name, rows, 1e6 * b / rows, 1e6 * k / rows, 1e6 * p / rows))


main()

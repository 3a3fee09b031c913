# Torch's CPU ops in a GPU worker: the 448 conversions and finiteness
# checks an 8B rank-16 LoRA adapter's load used to run on the host, timed
# with torch's default intra-op threads (one a core) and with one. On a
# 64-core VM the default took 1.9-3.6 s idle against 0.27 s for one thread
# (pyproc's GPU workers now use one, backend.py).
#
#   python3 cmd/gpubench/host_threads.py [LABEL]
import os
import sys
import time

import torch

label = sys.argv[1] if len(sys.argv) > 1 else ""
ts = [torch.randn(16, 4096).to(torch.bfloat16) if i % 2 else torch.randn(14336, 16).to(torch.bfloat16) for i in range(448)]


def run():
    t = time.time()
    for x in ts:
        y = x.float()
        bool(torch.isfinite(y).all())
    return time.time() - t


default = torch.get_num_threads()
for n in (default, 1, default):
    torch.set_num_threads(n)
    print("host threads %s cpus %d threads %d: %.3f s" % (label, os.cpu_count(), n, run()), flush=True)

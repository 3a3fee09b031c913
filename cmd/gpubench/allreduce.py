# All-reduce latency on the GPUs of one host: NCCL against torch's
# symmetric-memory one-shot and two-shot all-reduce (peer memory over
# NVLink, no multicast), each inside a CUDA graph of 32 back-to-back calls
# as a tensor-parallel decode step replays them. Sizes are [rows, hidden]
# bf16 (8B and 70B hiddens); the symmetric-memory figures include copying
# the input into the shared buffer. One process a GPU:
#
#   NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
#     python3 -m torch.distributed.run --nproc_per_node 2 cmd/gpubench/allreduce.py
import os

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm

rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
dev = torch.device("cuda", rank)
dist.init_process_group("nccl", device_id=dev)
g = dist.group.WORLD
name = g.group_name


def p(*a):
    if rank == 0:
        print("AR", *a, flush=True)


p("torch", torch.__version__, "world", ws, "NVLS", os.environ.get("NCCL_NVLS_ENABLE"), "MC", os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST"))
MAX = 64 * 8192
buf = symm.empty(MAX, dtype=torch.bfloat16, device=dev)
h = symm.rendezvous(buf, name)
p("rendezvous ok, multicast_ptr", getattr(h, "multicast_ptr", "?"))


def nccl(x, out):
    dist.all_reduce(x)
    return x


def one(x, out):
    n = x.numel()
    buf[:n].copy_(x.view(-1))
    torch.ops.symm_mem.one_shot_all_reduce_out(buf[:n], "sum", name, out.view(-1))
    return out


def two(x, out):
    n = x.numel()
    buf[:n].copy_(x.view(-1))
    torch.ops.symm_mem.two_shot_all_reduce_(buf[:n], "sum", name)
    out.view(-1).copy_(buf[:n])
    return out


REPS = 32
for rows in (1, 8, 32, 64, 256):
    for hidden in (4096, 8192):
        n = rows * hidden
        if n > MAX:
            continue
        row = []
        for label, fn in (("nccl", nccl), ("one_shot", one), ("two_shot", two)):
            try:
                x = torch.full((rows, hidden), float(rank + 1), dtype=torch.bfloat16, device=dev)
                out = torch.empty_like(x)
                r = fn(x.clone(), out)
                torch.cuda.synchronize()
                ok = bool((r == sum(range(1, ws + 1))).all())
                xs = [torch.full((rows, hidden), float(rank + 1), dtype=torch.bfloat16, device=dev) for _ in range(REPS)]
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for i in range(2):
                        fn(xs[0].clone(), out)
                torch.cuda.current_stream().wait_stream(s)
                gr = torch.cuda.CUDAGraph()
                with torch.cuda.graph(gr):
                    for i in range(REPS):
                        fn(xs[i], out)
                dist.barrier()
                torch.cuda.synchronize()
                for _ in range(3):
                    gr.replay()
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(20):
                    gr.replay()
                e1.record()
                torch.cuda.synchronize()
                us = e0.elapsed_time(e1) * 1000 / (20 * REPS)
                row.append("%s %.1fus%s" % (label, us, "" if ok else " WRONG"))
            except Exception as e:
                row.append("%s ERR %s" % (label, repr(e)[:160]))
        p("rows %d hidden %d (%d KB):" % (rows, hidden, n * 2 // 1024), " | ".join(row))
dist.barrier()
dist.destroy_process_group()

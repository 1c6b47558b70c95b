"""NCCL's all-to-all and all-reduce on this machine's GPUs, as PyTorch calls
them, for the bandwidth beside libmoert's exchanges (scripts/gpu-ep-check.sh
run, bench/run-train-ranks.sh run):

    python3 -m torch.distributed.run --nproc_per_node=2 bench/nccl_all_to_all.py

For each message size (bytes each rank sends in all, half to every other
rank on 2 GPUs), the median over 20 calls of all_to_all_single; printed by
rank 0 as GB/s of bytes sent to other ranks per GPU, the measure moert-ep-check
prints for libmoert; then all_reduce of f32 at the same sizes as bus
bandwidth (2 (n - 1) / n of the bytes per rank, nccl-tests' measure).
"""
import os
import statistics
import time

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
for mib in (1, 8, 16.3, 64, 256):
    n = int(mib * 2**20) // 4 // world * world
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for i in range(25):
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_to_all_single(dst, src)
        torch.cuda.synchronize()
        if i >= 5:
            times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    to_others = n * 4 * (world - 1) / world
    if rank == 0:
        print(f"NCCL all_to_all_single {n * 4 / 2**20:8.1f} MiB per rank: {t * 1e3:7.3f} ms, "
              f"{to_others / t / 1e9:6.1f} GB/s to other ranks per GPU")
for mib in (1, 8, 64, 256):
    n = int(mib * 2**20) // 4
    buf = torch.randn(n, device="cuda")
    times = []
    for i in range(25):
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        torch.cuda.synchronize()
        if i >= 5:
            times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    if rank == 0:
        print(f"NCCL all_reduce (f32)      {n * 4 / 2**20:8.1f} MiB per rank: {t * 1e3:7.3f} ms, "
              f"{2 * (world - 1) / world * n * 4 / t / 1e9:6.1f} GB/s bus bandwidth")
dist.destroy_process_group()

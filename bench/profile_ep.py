"""Where the time of an expert-parallel program goes, kernel by kernel, on
every rank (one process per GPU, torchrun-style environment).

    for r in 0 1; do RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
        MASTER_PORT=29533 python3 bench/profile_ep.py ARTIFACT.so FUNCTION \
        > rank$r.txt & done; wait

FUNCTION's arguments are made up from its signature in the artifact (normal
floats, 0.02 for tensors of rank 3: stacked expert weights); integer
arguments are not supported. Each rank runs it on its GPU (LOCAL_RANK, as
libmoert picks it; its exchanges find each other through the TCP store at
MASTER_ADDR:MASTER_PORT) under PyTorch's profiler and prints the table of
bench/profile_layer.py, the exchanges' time included (NCCL kernels, copies).
"""
import os
import sys

import torch

from moe_mlir import load
from profile_layer import kernel_table

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def main():
    path, name = sys.argv[1], sys.argv[2]
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(local)
    art = load(path)
    if name not in art.functions:
        sys.exit(f"{path} has no function {name!r} (it has {', '.join(art.functions)})")
    g = torch.Generator(device="cuda").manual_seed(rank)
    args = []
    for spec in art.functions[name][0]:
        if spec.dtype not in DTYPES or any(d < 0 for d in spec.shape):
            sys.exit(f"{name}: cannot make up an argument of {spec}")
        t = torch.randn(tuple(spec.shape), device="cuda", generator=g)
        args.append((t * (0.02 if len(spec.shape) == 3 else 1.0)).to(DTYPES[spec.dtype]))
    kernel_table(lambda: getattr(art, name)(*args),
                 f"rank {rank} of {world}: {path} @{name}", top)


if __name__ == "__main__":
    main()

"""transformers' Qwen3-MoE sparse block, original beside moe_mlir.torch.patch,
in one GPU run: Qwen3-30B-A3B layer dimensions (hidden 2048, expert FFN 768,
128 experts, top-8), forward + backward, tokens/s (median of runs) and peak
memory, and the patched block's agreement with the original (f32).

    PYTHONPATH=python MOERT_LIBRARY=<build>/lib/libmoert.so \\
    MOE_MLIR_ARTIFACTS=gpu-artifacts python3 bench/torch_patch.py TOKENS

The patched layer must have been compiled for TOKENS (compile_layer with
target sm_90a; scripts/gpu-check.sh prepare does it for bench shapes).
"""
import copy
import ctypes
import statistics
import sys
import time

import torch
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

import moe_mlir.torch
from moe_mlir import runtime

tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
config = Qwen3MoeConfig(hidden_size=2048, moe_intermediate_size=768, num_experts=128,
                        num_experts_per_tok=8, norm_topk_prob=True)
torch.manual_seed(0)
block = Qwen3MoeSparseMoeBlock(config).cuda().float()
for p in block.parameters():
    torch.nn.init.normal_(p, std=0.02)


def run(b, x, dy, repeat=5):
    times = []
    for i in range(repeat + 1):
        xx = x.detach().clone().requires_grad_(True)
        b.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        y = b(xx)
        y.backward(dy)
        torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), y.detach(), xx.grad


class Stats(ctypes.Structure):
    _fields_ = [("in_use", ctypes.c_size_t), ("cached", ctypes.c_size_t),
                ("peak", ctypes.c_size_t), ("allocs", ctypes.c_uint64), ("reuses", ctypes.c_uint64)]


x = torch.randn(1, tokens, 2048, device="cuda")
dy = torch.randn_like(x)
rows = []
peers = [("transformers eager f32", block, torch.float32),
         ("transformers eager bf16", copy.deepcopy(block).bfloat16(), torch.bfloat16)]
grouped = copy.deepcopy(block).bfloat16()
grouped.experts.config = copy.copy(config)
grouped.experts.config._experts_implementation = "grouped_mm"
peers.append(("transformers grouped_mm bf16", grouped, torch.bfloat16))
for name, b, dtype in peers:
    torch.cuda.reset_peak_memory_stats()
    try:
        t, _, _ = run(b, x.to(dtype), dy.to(dtype))
    except Exception as err:  # a peer this transformers version lacks
        print(f"{name}: unavailable ({str(err).splitlines()[0][:80]})")
        continue
    rows.append((name, t, torch.cuda.max_memory_allocated()))

patched = copy.deepcopy(block)
moe_mlir.torch.patch(patched)
torch.cuda.reset_peak_memory_stats()
t, y, gx = run(patched, x, dy, repeat=3)
stats = Stats()
runtime.moert().moert_gpu_get_memory_stats(ctypes.byref(stats))
rows.append(("moe-mlir patch f32 (generic kernels)", t,
             torch.cuda.max_memory_allocated() + stats.peak))
_, y0, gx0 = run(block, x, dy, repeat=1)

print(f"Qwen3-MoE sparse block, {tokens} tokens, fwd+bwd on {torch.cuda.get_device_name()}")
print(f"{'':40s} {'ms':>10s} {'tokens/s':>12s} {'peak GiB':>9s}")
for name, t, mem in rows:
    print(f"{name:40s} {t * 1e3:10.1f} {tokens / t:12.0f} {mem / 2**30:9.2f}")
rel = float((y - y0).abs().max() / y0.abs().max())
relg = float((gx - gx0).abs().max() / gx0.abs().max())
print(f"patched vs original (f32): output max rel diff {rel:.1e}, input grad {relg:.1e}")
sys.exit(0 if rel < 1e-3 and relg < 1e-3 else 1)

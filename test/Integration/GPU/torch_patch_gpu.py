"""moe_mlir.torch.patch on CUDA tensors against the same patch on the CPU
(run by scripts/gpu-check.sh on a GPU machine; needs torch, transformers and
libmoert; the layers are precompiled by `scripts/gpu-check.sh prepare`).

A Qwen3-MoE sparse block (hidden 128, expert FFN 128, 8 experts, top-2,
200 tokens: the 224-token bucket, so padded rows too) runs on the GPU with
recipe none (f32, the arithmetic of the CPU reference, the same block
patched on the CPU: output and gradients within 1e-4 of the largest entry)
and with recipe bf16 (the block in bf16; its reference is the CPU patch on
the same bf16 weights and input, widened to f32: within 2e-2 in norm, the
bf16 roundings of the GEMMs' activation operands and of the results). The
GPU calls run on a side stream made current (torch.cuda.stream), so their
work must be queued on it: read on that stream, the results are right.
Last, the compiled forward called directly with DLPack producers (objects
with only __dlpack__ / __dlpack_device__) gives what it gives for the torch
tensors they wrap.

    python3 torch_patch_gpu.py ARTIFACT_DIR
"""
import copy
import sys

import torch
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

import moe_mlir.torch

artifacts = sys.argv[1]
config = Qwen3MoeConfig(hidden_size=128, moe_intermediate_size=128, num_experts=8,
                        num_experts_per_tok=2, norm_topk_prob=True)
torch.manual_seed(0)
cpu = Qwen3MoeSparseMoeBlock(config)
for p in cpu.parameters():
    torch.nn.init.normal_(p, std=0.1)
blocks = {"cpu": copy.deepcopy(cpu), "cpu bf16 values": copy.deepcopy(cpu).bfloat16().float(),
          "gpu none": copy.deepcopy(cpu).cuda(), "gpu bf16": copy.deepcopy(cpu).cuda().bfloat16()}
for name, b in blocks.items():
    moe_mlir.torch.patch(b, recipe=name.split()[-1] if "gpu" in name else "none",
                         artifacts=artifacts)

x = torch.randn(1, 200, 128)
dy = torch.randn(1, 200, 128)
xb, dyb = x.bfloat16().float(), dy.bfloat16().float()  # the bf16 run's values
results = {}
side = torch.cuda.Stream()
for name, b in blocks.items():
    dev = "cuda" if "gpu" in name else "cpu"
    dtype = torch.bfloat16 if name == "gpu bf16" else torch.float32
    xin, dyin = (xb, dyb) if "bf16" in name else (x, dy)
    xx = xin.to(dev, dtype).detach().clone().requires_grad_(True)
    with torch.cuda.stream(side):
        y = b(xx)
        y.backward(dyin.to(dev, dtype))
        out = [t.detach().float().cpu() for t in (y, xx.grad, b.experts.gate_up_proj.grad,
                                                  b.experts.down_proj.grad, b.gate.weight.grad)]
    results[name] = out

failures = 0
labels = ("output", "input grad", "gate_up_proj grad", "down_proj grad", "router grad")
for name, ref, bound, norm in (("gpu none", "cpu", 1e-4, False),
                               ("gpu bf16", "cpu bf16 values", 2e-2, True)):
    for label, got, want in zip(labels, results[name], results[ref]):
        err = float((got - want).norm() / want.norm()) if norm else \
            float((got - want).abs().max() / want.abs().max())
        ok = err <= bound
        failures += not ok
        print(f"{'ok' if ok else 'FAIL'}: {name} vs {ref}, {label}: {err:.1e} "
              f"(bound {bound:.0e})")


class Producer:
    """A CUDA array known only through the DLPack protocol."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, **kwargs):
        return self._t.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


block = blocks["gpu bf16"]
artifact = [a for k, a in moe_mlir.torch._loaded.items() if k[6] == "bf16"][0]
xs = torch.cat([xb.reshape(200, 128), torch.zeros(24, 128)]).cuda().bfloat16()
args = [xs, block.gate.weight.t(), block.experts.gate_up_proj.transpose(1, 2),
        block.experts.down_proj.transpose(1, 2)]
args = [a.detach() for a in args]  # torch exports no tensor that requires grad
direct = artifact.call_torch("moe_block_grad_forward", *args)
via = artifact.call_torch("moe_block_grad_forward",
                          *[Producer(a.contiguous()) for a in args])
same = all(torch.equal(a, b) for a, b in zip(direct, via))
failures += not same
print(f"{'ok' if same else 'FAIL'}: DLPack producers as arguments give the same results")
sys.exit(1 if failures else 0)

# RUN: %python %s
#
# moe_mlir.torch.patch on transformers' own Qwen3-MoE (tiny config, f32, CPU):
# a patched sparse block, and a whole patched causal LM, give the same outputs,
# loss and parameter gradients as the original, on the same weights.
# Tolerance: both compute in f32 with sums in a different order (torch's
# index_add per expert vs. moe-mlir's combine; BLAS vs. in-order matmuls):
# differences of a few f32 ulps of the largest terms, so relative 1e-4 on
# outputs and 1e-3 on gradients (which go through more sums).
import copy
import sys

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

import moe_mlir.torch

torch.manual_seed(0)
config = Qwen3MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                        num_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                        vocab_size=50, norm_topk_prob=True, decoder_sparse_step=1,
                        mlp_only_layers=[])
model = Qwen3MoeForCausalLM(config).float()
for p in model.parameters():  # the experts start at zero/empty otherwise
    torch.nn.init.normal_(p, std=0.2)
patched = copy.deepcopy(model)
n = moe_mlir.torch.patch(patched)

failures = 0


def check(ok, what):
    global failures
    failures += not ok
    print(f"{'ok' if ok else 'FAIL'}: {what}")


def rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


check(n == 2, f"patched {n} sparse blocks")

# One block.
block, pblock = model.model.layers[0].mlp, patched.model.layers[0].mlp
x = torch.randn(3, 5, 32, requires_grad=True)
px = x.detach().clone().requires_grad_(True)
y, py = block(x), pblock(px)
check(rel(py, y) < 1e-4, f"block output (max rel diff {rel(py, y):.1e})")
dy = torch.randn_like(y)
y.backward(dy)
py.backward(dy)
check(rel(px.grad, x.grad) < 1e-3, f"block input gradient ({rel(px.grad, x.grad):.1e})")
for name, p in block.named_parameters():
    pp = dict(pblock.named_parameters())[name]
    check(rel(pp.grad, p.grad) < 1e-3, f"block gradient of {name} ({rel(pp.grad, p.grad):.1e})")

# The whole model: loss and every gradient.
model.zero_grad()
patched.zero_grad()
ids = torch.randint(0, 50, (2, 12))
loss = model(input_ids=ids, labels=ids).loss
ploss = patched(input_ids=ids, labels=ids).loss
check(abs(float(ploss - loss)) < 1e-5 * abs(float(loss)) + 1e-6,
      f"causal LM loss {float(loss):.6f} vs {float(ploss):.6f}")
loss.backward()
ploss.backward()
worst = max(rel(pp.grad, p.grad) for (_, p), (_, pp) in
            zip(model.named_parameters(), patched.named_parameters()) if p.grad is not None)
check(worst < 1e-3, f"every parameter gradient of the model (worst rel diff {worst:.1e})")
sys.exit(1 if failures else 0)

"""transformers' Qwen3-MoE sparse block beside moe_mlir.torch.patch, in one
GPU run: the layer dimensions of a Qwen3-MoE config.json (default
Qwen3-30B-A3B's: hidden 2048, expert FFN 768, 128 experts, top-8), bf16
block, forward + backward, per token count:

    python3 bench/torch_patch.py ARTIFACT_DIR [--config FILE] [TOKENS ...]
    python3 bench/torch_patch.py ARTIFACT_DIR [--config FILE] --profile TOKENS RECIPE
    (bench/run-torch-patch.sh)

Rows: transformers with its default experts (eager bf16, at the smallest
token count only: it loops over experts) and with grouped_mm (bf16), then
the same block patched with recipe bf16 and mxfp8 (mxfp8 where the hidden
and FFN dims are multiples of 32; layers precompiled by
`bench/run-torch-patch.sh prepare` into ARTIFACT_DIR; the patch finds them
by shape, nothing compiles here). Per row: milliseconds per fwd+bwd step
(median after a warm-up, synchronized after each step), tokens/s, peak GPU
memory of the step (torch's peak plus, for ours, libmoert's: the weights,
their gradients, the input and its gradient included), the host time to
queue a step (the patch does not synchronize: queuing takes far less than
the step), and the relative error (||diff|| / ||ref||) of the output and of
the gradients of the input and of w1 (gate_up_proj) against the f32 block on
the same weights and inputs. Also one token count that is not a bucket
(3000 -> 3072 rows) to show bucketing. --profile: the patched step's kernels
(bench/profile_layer.py's table).
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time

import torch
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

import moe_mlir.torch
from moe_mlir import runtime

parser = argparse.ArgumentParser(usage=__doc__.split("\n\n")[1].strip())
parser.add_argument("artifacts")
parser.add_argument("--config", default=os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "test", "Models", "Inputs",
    "qwen3-30b-a3b-2layers.json"), help="a Qwen3-MoE config.json (default Qwen3-30B-A3B's)")
parser.add_argument("--profile", nargs=2, metavar=("TOKENS", "RECIPE"))
parser.add_argument("tokens", type=int, nargs="*", default=[2048, 4096, 8192, 16384])
args = parser.parse_intermixed_args()
artifacts = args.artifacts
with open(args.config) as f:
    dims = json.load(f)
dims.setdefault("num_experts", dims.get("num_local_experts"))
missing = [k for k in ("hidden_size", "moe_intermediate_size", "num_experts",
                       "num_experts_per_tok") if dims.get(k) is None]
if missing:
    sys.exit(f"torch_patch.py: {args.config} has no {', '.join(missing)}")
H = dims["hidden_size"]
config = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=dims["moe_intermediate_size"],
                        num_experts=dims["num_experts"],
                        num_experts_per_tok=dims["num_experts_per_tok"],
                        norm_topk_prob=bool(dims.get("norm_topk_prob", True)))
torch.manual_seed(0)
ref = Qwen3MoeSparseMoeBlock(config).cuda().float()
for p in ref.parameters():
    torch.nn.init.normal_(p, std=0.02)

if args.profile:
    from profile_layer import kernel_table
    T, recipe = int(args.profile[0]), args.profile[1]
    b = copy.deepcopy(ref).bfloat16()
    moe_mlir.torch.patch(b, recipe=recipe, artifacts=artifacts)
    x = torch.randn(1, T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)

    def profiled_step():  # as measure() times it: gradients set, not added to
        b.zero_grad(set_to_none=True)
        x.grad = None
        b(x).backward(dy)

    kernel_table(profiled_step, f"patched block, {T} tokens, recipe {recipe}", 40)
    sys.exit(0)
counts = args.tokens
# MXFP8 blocks of 32 along the hidden and FFN dims.
recipes = ["bf16"] + (["mxfp8"] if H % 32 == 0 and dims["moe_intermediate_size"] % 32 == 0
                      else [])


def step(b, x, dy):
    xx = x.detach().clone().requires_grad_(True)
    b.zero_grad(set_to_none=True)
    y = b(xx)
    y.backward(dy)
    return y, xx.grad


def measure(b, x, dy, repeat):
    step(b, x, dy)  # warm-up (and, for ours, loading the layer)
    b.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    if runtime._moert is not None:
        runtime.moert().moert_gpu_reset_peak_memory()
    before = torch.cuda.memory_allocated() + runtime.gpu_memory_stats().in_use
    times, queued = [], []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        y, gx = step(b, x, dy)
        queued.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() + runtime.gpu_memory_stats().peak - before
    return statistics.median(times), statistics.median(queued), peak, y, gx


def rel(a, b):
    """||a - b|| / ||b|| (a norm, not the largest entry: a token whose
    near-tied experts the bf16 router orders the other way differs by its
    whole output, in the peers as in ours)."""
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm())


print(f"# Qwen3-MoE sparse block (hidden {H}, expert FFN {dims['moe_intermediate_size']}, "
      f"{dims['num_experts']} experts, top-{dims['num_experts_per_tok']}), bf16,")
print(f"# forward + backward on {torch.cuda.get_device_name()}, torch {torch.__version__}")
print(f"{'tokens':>6s} {'':34s} {'ms':>7s} {'tokens/s':>9s} {'step MiB':>9s} "
      f"{'queue ms':>9s} {'err y':>8s} {'err dx':>8s} {'err dw1':>8s}")
failures = 0
for T in counts + [3000]:
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(1, T, H, device="cuda", generator=g)
    dy = torch.randn(1, T, H, device="cuda", generator=g)
    y0, gx0 = step(ref, x, dy)
    gw0 = ref.experts.gate_up_proj.grad.detach().clone()
    y0, gx0 = y0.detach(), gx0.detach()
    rows = []
    if T == counts[0]:
        rows.append("transformers eager bf16")
    if T != 3000:
        rows.append("transformers grouped_mm bf16")
    rows += [f"moe-mlir patch, recipe {r}" for r in recipes if T != 3000 or r == "bf16"]
    xb, dyb = x.bfloat16(), dy.bfloat16()
    for name in rows:
        b = copy.deepcopy(ref).bfloat16()  # each row's own block, made here
        if "grouped_mm" in name:
            b.experts.config = copy.copy(config)
            b.experts.config._experts_implementation = "grouped_mm"
        elif name.startswith("moe-mlir"):
            moe_mlir.torch.patch(b, recipe=name.split()[-1], artifacts=artifacts)
        try:
            t, q, peak, y, gx = measure(b, xb, dyb, repeat=3 if "eager" in name else 10)
        except Exception as err:  # a peer this transformers version lacks
            print(f"{T:6d} {name:34s} unavailable ({str(err).splitlines()[0][:80]})")
            if name.startswith("moe-mlir"):
                failures += 1
            continue
        errs = (rel(y, y0), rel(gx, gx0), rel(b.experts.gate_up_proj.grad, gw0))
        print(f"{T:6d} {name:34s} {t * 1e3:7.2f} {T / t:9.0f} {peak / 2**20:9.0f} "
              f"{q * 1e3:9.2f} {errs[0]:8.1e} {errs[1]:8.1e} {errs[2]:8.1e}", flush=True)
        # Gross errors only (bf16: a few roundings of the inputs of f32 sums,
        # and the tokens whose routing the rounding changes; MXFP8: 3-bit
        # mantissas).
        if name.startswith("moe-mlir") and max(errs) > (2e-1 if "mxfp8" in name else 1e-1):
            failures += 1
        del b, y, gx
    torch.cuda.empty_cache()
    if runtime._moert is not None:
        runtime.moert().moert_gpu_empty_cache()
sys.exit(1 if failures else 0)

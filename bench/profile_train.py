"""Where the time of a whole model's compiled train step goes.

    python3 bench/profile_train.py ARTIFACT.so [TOP]

ARTIFACT is a train step of moe-train (`--compile-only`, e.g. from
`scripts/gpu-train.sh prepare`): `loss_step` with the optimizer inside.
The parameters are drawn as moe-train would (N(0, 0.02), ones for norms),
the moments start at zero, the batch is random tokens; the state lives in
CUDA torch tensors that the step updates in place. Prints the kernel table
of bench/profile_layer.py for 3 profiled steps (after 2 warmup steps), then
the step by stage, from the kernels' names (the dedicated kernels' and the
generic kernels', which carry the model part they belong to:
-moe-gpu-name-kernels): attention (flash kernels; the attention block's
norms, rotary and roundings), experts (expert GEMMs and the 8-bit recipes'
quantize kernels, which only the expert GEMMs use by default; router,
dispatch, combine), dense GEMMs (projections, router), LM head + loss (its GEMMs,
cross-entropy), optimizer (clipping and AdamW), the rest.
"""
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_layer import kernel_table  # noqa: E402


def step_arguments(art):
    args, _ = art.functions["loss_step"]
    meta_vocab = None
    gen = torch.Generator(device="cuda").manual_seed(0)
    values = []
    for spec in args:
        shape = tuple(spec.shape)
        if spec.param:
            if spec.init == "ones":
                values.append(torch.ones(shape, device="cuda"))
            else:
                values.append(torch.randn(shape, device="cuda", generator=gen) * 0.02)
            if spec.param == "model.embed_tokens.weight":
                meta_vocab = shape[0]
        elif spec.state:
            values.append(torch.zeros(shape, device="cuda"))
        elif spec.input in ("ids", "labels"):
            values.append(torch.randint(0, meta_vocab or 24, shape, device="cuda",
                                        dtype=torch.int32, generator=gen))
        elif spec.input == "adamw":
            b1, b2, lr, t = 0.9, 0.95, 1e-4, 10
            values.append(torch.tensor([lr / (1 - b1 ** t), (1 - b2 ** t) ** 0.5,
                                        1 - lr * 0.1, b1, b2, 1e-8, 1.0, lr],
                                       device="cuda"))
        else:
            raise SystemExit(f"loss_step has an argument of no known role: {spec}")
    return values


def stage(name, vocab):
    """The stage of the train step a kernel (by name) belongs to."""
    n = name.lower()
    if "optimizer" in n:
        return "optimizer"
    if "moe_flash" in n or "self_attn" in n:
        return "attention"
    if "moe_xent" in n or "lm_head" in n or "_loss_kernel" in n or \
            (vocab and re.search(rf"(^|[x_]){vocab}(x|_)", n)):
        return "LM head + loss"
    experts = re.search(r"_e(\d+)_", n)
    if (experts and int(experts.group(1)) > 1) or "_mlp_" in n or \
            n.startswith(("moe_fp8block_", "moe_mx_")):
        return "experts"
    if n.startswith(("moe_wgmma", "moe_simt", "moe_tma_")):
        return "dense GEMMs"
    return "the rest"


def main():
    from moe_mlir import load

    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    art = load(path)
    args = step_arguments(art)
    tokens = next(a.numel() for a, s in zip(args, art.functions["loss_step"][0])
                  if s.input == "ids")
    totals, wall = kernel_table(lambda: art.loss_step(*args), f"{path}, {tokens} tokens", top)
    vocab = next((a.shape[0] for a, s in zip(args, art.functions["loss_step"][0])
                  if s.param == "model.embed_tokens.weight"), None)
    by_stage = {}
    for name, ms in totals.items():
        by_stage[stage(name, vocab)] = by_stage.get(stage(name, vocab), 0.0) + ms
    print(f"# the step by stage ({wall:.2f} ms wall)")
    for st in ("attention", "experts", "dense GEMMs", "LM head + loss", "optimizer", "the rest"):
        ms = by_stage.get(st, 0.0)
        print(f"{st:16s} {ms:9.3f} ms {100 * ms / wall:6.1f}%")


if __name__ == "__main__":
    main()

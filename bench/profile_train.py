"""Where the time of a whole model's compiled train step goes.

    python3 bench/profile_train.py ARTIFACT.so [TOP]

ARTIFACT is a train step of moe-train (`--compile-only`, e.g. from
`scripts/gpu-train.sh prepare`): `loss_step` with the optimizer inside.
The parameters are drawn as moe-train would (N(0, 0.02), ones for norms),
the moments start at zero, the batch is random tokens; the state lives in
CUDA torch tensors that the step updates in place. Prints the kernel table
of bench/profile_layer.py for 3 profiled steps (after 2 warmup steps).
"""
import os
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


def main():
    from moe_mlir import load

    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    art = load(path)
    args = step_arguments(art)
    tokens = next(a.numel() for a, s in zip(args, art.functions["loss_step"][0])
                  if s.input == "ids")
    kernel_table(lambda: art.loss_step(*args), f"{path}, {tokens} tokens", top)


if __name__ == "__main__":
    main()

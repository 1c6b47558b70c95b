# RUN: %python %s
#
# The compiled optimizer (-moe-adamw) against torch: a small loss (matmul,
# RMSNorm, tanh) is differentiated and given the AdamW update, compiled for
# the CPU, and trained 6 steps with a changing learning rate, once with
# clipping that triggers and once without; after every step the loss, the
# gradient norm, the parameters and both moments match torch's
# clip_grad_norm_ + torch.optim.AdamW (weight decay on the matrix only) on
# the same loss. The step updates its parameter and moment arguments in
# place and returns only the loss and the norm.
import os
import tempfile

import numpy as np
import torch

import moe_mlir
from moe_mlir import MLIRError
from checks import check, finish

SOURCE = """
func.func @loss(%x: tensor<5x4xf32> {moe.no_grad}, %w: tensor<4x3xf32>,
                %g: tensor<3xf32>, %proj: tensor<15x1xf32> {moe.no_grad}) -> tensor<f32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<5x3xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<5x3xf32>) -> tensor<5x3xf32>
  %h = linalg.matmul ins(%x, %w : tensor<5x4xf32>, tensor<4x3xf32>) outs(%z : tensor<5x3xf32>) -> tensor<5x3xf32>
  %n = moe.rms_norm %h, %g eps(1.0e-6) : tensor<5x3xf32>, tensor<3xf32> -> tensor<5x3xf32>
  %t = math.tanh %n : tensor<5x3xf32>
  %flat = tensor.collapse_shape %t [[0, 1]] : tensor<5x3xf32> into tensor<15xf32>
  %row = tensor.expand_shape %flat [[0, 1]] output_shape [1, 15] : tensor<15xf32> into tensor<1x15xf32>
  %e1 = tensor.empty() : tensor<1x1xf32>
  %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<1x1xf32>) -> tensor<1x1xf32>
  %m = linalg.matmul ins(%row, %proj : tensor<1x15xf32>, tensor<15x1xf32>) outs(%z1 : tensor<1x1xf32>) -> tensor<1x1xf32>
  %l = tensor.collapse_shape %m [] : tensor<1x1xf32> into tensor<f32>
  return %l : tensor<f32>
}
"""

B1, B2, EPS, WD = 0.9, 0.95, 1e-8, 0.1


def scalars(t, lr, clip):
    """The step's tensor<8xf32> (as libmoert's adamwScalars computes it)."""
    return np.array([lr / (1 - B1 ** t), np.sqrt(1 - B2 ** t), 1 - lr * WD,
                     B1, B2, EPS, clip, lr], dtype=np.float32)


def torch_loss(x, w, g, proj):
    h = x @ w
    n = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * g
    return (torch.tanh(n).reshape(1, 15) @ proj).reshape(())


with tempfile.TemporaryDirectory() as tmp:
    m = moe_mlir.Module.parse(SOURCE)
    m.run("builtin.module(moe-autodiff, moe-adamw)")
    ir = str(m)
    check("@loss_step(" in ir and "@loss_grad(" not in ir,
          "-moe-adamw turns @loss_grad into @loss_step")
    so = os.path.join(tmp, "step.so")
    m.compile("cpu", so)
    art = moe_mlir.load(so)
    args, results = art.functions["loss_step"]
    check([a.updated for a in args] == [False, True, True, False] + [True] * 4 + [False]
          and [(a.state, a.state_of) for a in args[4:8]]
          == [("exp_avg", 1), ("exp_avg", 2), ("exp_avg_sq", 1), ("exp_avg_sq", 2)]
          and args[8].input == "adamw" and len(results) == 2,
          "manifest: w and g and their moments are updated in place; results: loss, norm")

    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    proj = rng.standard_normal((15, 1)).astype(np.float32)
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    g0 = (1 + 0.1 * rng.standard_normal(3)).astype(np.float32)

    for clip in (0.5, 0.0):
        w, g = w0.copy(), g0.copy()
        mw, mg, vw, vg = (np.zeros_like(a) for a in (w, g, w, g))
        tw = torch.nn.Parameter(torch.from_numpy(w0.copy()))
        tg = torch.nn.Parameter(torch.from_numpy(g0.copy()))
        opt = torch.optim.AdamW([{"params": [tw], "weight_decay": WD},
                                 {"params": [tg], "weight_decay": 0.0}],
                                lr=1e-2, betas=(B1, B2), eps=EPS)
        worst, clipped = 0.0, 0
        for t in range(1, 7):
            lr = 1e-2 * (1.5 - 0.1 * t)
            loss, norm = art.loss_step(x, w, g, proj, mw, mg, vw, vg, scalars(t, lr, clip))
            opt.zero_grad()
            ref_loss = torch_loss(torch.from_numpy(x), tw, tg, torch.from_numpy(proj))
            ref_loss.backward()
            ref_norm = float(torch.nn.utils.clip_grad_norm_([tw, tg], clip if clip else float("inf")))
            clipped += clip > 0 and ref_norm > clip
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
            state = [opt.state[tw]["exp_avg"], opt.state[tg]["exp_avg"],
                     opt.state[tw]["exp_avg_sq"], opt.state[tg]["exp_avg_sq"]]
            pairs = [(w, tw), (g, tg), (mw, state[0]), (mg, state[1]),
                     (vw, state[2]), (vg, state[3])]
            err = max(float(np.max(np.abs(ours - theirs.detach().numpy()) /
                                   (np.abs(theirs.detach().numpy()) + 1e-6)))
                      for ours, theirs in pairs)
            err = max(err, abs(float(loss) - ref_loss.item()) / (abs(ref_loss.item()) + 1e-6),
                      abs(float(norm) - ref_norm) / ref_norm)
            worst = max(worst, err)
        check(worst < 1e-4,
              f"clip {clip}: 6 steps match clip_grad_norm_ + torch.optim.AdamW "
              f"(worst relative difference {worst:.1e})")
        if clip:
            check(clipped >= 2, f"clip {clip}: clipping took effect ({clipped} of 6 steps)")

    # Arguments updated in place must be writable arrays.
    try:
        ro = w0.copy()
        ro.setflags(write=False)
        art.loss_step(x, ro, g0.copy(), proj, *(np.zeros_like(a) for a in (w0, g0, w0, g0)),
                      scalars(1, 1e-3, 0))
        check(False, "a read-only updated argument is refused")
    except TypeError as err:
        check("updated in place" in str(err), "a read-only updated argument is refused")

    # Errors: no train step; an expert-parallel step.
    try:
        moe_mlir.Module.parse(SOURCE).run("builtin.module(moe-adamw)")
        check(False, "-moe-adamw without a train step is refused")
    except MLIRError as err:
        check("no train step" in str(err), "-moe-adamw without a train step is refused")

finish()

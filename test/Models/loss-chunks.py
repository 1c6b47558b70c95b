# RUN: %python %s %t moe-train
#
# moe-train --loss-chunk-rows (-moe-chunk-loss): the LM head, the
# cross-entropy and their backward in chunks of tokens train as the whole
# batch at once does, up to f32 rounding (the loss summed in another order,
# the LM head's weight gradient summed over the chunks): the protein model
# under the bf16 recipe, 8 x 128 tokens a step in chunks of 384 (the last
# holding 256), the losses, gradient norms and trained parameters against
# the unchunked run's. Bad values are refused with a message. (Several
# ranks: test/Models/train-ranks.py.)
import json
import os
import shutil
import subprocess
import sys

import numpy as np

from checks import PROTEIN_CONFIG, PROTEIN_DATA, check, finish
from moe_mlir import hf

out, tool = sys.argv[1], sys.argv[2]
shutil.rmtree(out, ignore_errors=True)
os.makedirs(out)


def train(name, *args):
    d = os.path.join(out, name)
    r = subprocess.run([tool, "--config", PROTEIN_CONFIG, *PROTEIN_DATA, "--progress", "none",
                        "--steps", "8", "--batch", "8", "--seq", "128", "--eval-every", "0",
                        "--out", d, *args], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
    return r, d


def steps(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [m for m in map(json.loads, f) if "loss" in m]


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


# The train pipeline chunks the step: three losses of 384, 384 and 256 rows.
model = os.path.join(out, "model.mlir")
subprocess.run(["moe-model", PROTEIN_CONFIG, "--batch", "8", "--seq", "128", "-o", model], check=True)
ir = subprocess.run(["moe-opt", model, "--moe-train-pipeline=recipe=bf16 autodiff=true "
                     "loss-chunk-rows=384 optimizer=adamw"],
                    capture_output=True, text=True, check=True).stdout
step = ir[ir.index("@loss_step"):]
shapes = [m for m in step.split("moe.cross_entropy ")[1:]]
rows = [int(m.split("tensor<")[1].split("x")[0]) for m in shapes]
check(rows == [384, 384, 256] and "tensor<1024x24xf32>" not in step,
      f"the train step's loss in chunks of {rows} rows, no [1024, 24] logits")

r0, whole = train("whole", "--recipe", "bf16")
r1, chunked = train("chunked", "--recipe", "bf16", "--loss-chunk-rows", "384")
check(r0.returncode == 0 and r1.returncode == 0 and "not chunked" not in r1.stderr,
      "both runs train")
a, b = steps(whole), steps(chunked)
check(len(a) == len(b) == 8, "8 steps each")
loss_gap = max(relative(x["loss"], y["loss"]) for x, y in zip(b, a))
norm_gap = max(relative(x["grad_norm"], y["grad_norm"]) for x, y in zip(b, a))
check(loss_gap < 2e-6, f"losses agree (largest relative difference {loss_gap:.1e}, bound 2e-6)")
check(norm_gap < 2e-6, f"gradient norms agree ({norm_gap:.1e}, bound 2e-6)")
pa, _ = hf.read_safetensors(os.path.join(whole, "checkpoint.safetensors"))
pb, _ = hf.read_safetensors(os.path.join(chunked, "checkpoint.safetensors"))
params = [n for n in pa if n.startswith(("model.", "lm_head"))]
gap = max(float(np.max(np.abs(pb[n] - pa[n]))) for n in params)
check(sorted(pa) == sorted(pb) and gap < 1e-6,
      f"trained parameters agree after 8 steps (largest difference {gap:.1e}, bound 1e-6)")

for args, message in [
        (["--loss-chunk-rows", "64"], "--loss-chunk-rows needs --recipe"),
        (["--recipe", "bf16", "--loss-chunk-rows", "-3"], "--loss-chunk-rows expects a non-negative"),
        (["--recipe", "bf16", "--dense", "fp8-blockwise", "--loss-chunk-rows", "64"],
         "--dense fp8-blockwise: a multiple of 128"),
        (["--recipe", "bf16", "--dense", "mxfp8", "--loss-chunk-rows", "48"],
         "--dense mxfp8: a multiple of 32")]:
    r, _ = train("bad", *args)
    check(r.returncode == 1 and message in r.stderr, f"refused: {' '.join(args)}")
finish()

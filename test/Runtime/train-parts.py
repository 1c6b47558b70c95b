# RUN: rm -rf %t && mkdir -p %t && moert-train-test %t > %t/parts.json
# RUN: %python %s %t
#
# libmoert's training-loop parts against independent implementations:
# AdamW against torch.optim.AdamW (5 steps, with and without weight decay;
# f32, within 1e-6), the warmup + cosine schedule and clipping against their
# formulas, the safetensors file through the safetensors package, the loss
# plot through zlib (a valid PNG of the stated size).
import json
import math
import struct
import sys
import zlib

import numpy as np
import torch
from safetensors.numpy import load_file
from checks import check, finish

d = sys.argv[1]
parts = json.load(open(f"{d}/parts.json"))


for key, wd in (("adamw", 0.0), ("adamw_decay", 0.1)):
    p = torch.nn.Parameter(torch.tensor([math.sin(1.0 + i) for i in range(7)], dtype=torch.float32))
    opt = torch.optim.AdamW([p], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd)
    for t in range(1, 6):
        p.grad = torch.tensor([math.cos(0.3 * t + i) * (i + 1) * 0.1 for i in range(7)],
                              dtype=torch.float32)
        opt.step()
    err = float(np.max(np.abs(np.array(parts[key]) - p.detach().numpy())))
    check(err <= 1e-6, f"{key}: 5 steps match torch.optim.AdamW (max diff {err:.1e})")


def lr(s, warmup=3, total=10, peak=1.0, floor=0.1):
    if s < warmup:
        return peak * (s + 1) / warmup
    if s >= total:
        return peak * floor
    prog = (s - warmup) / (total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * prog)))


check(np.allclose(parts["lr"], [lr(s) for s in range(12)], rtol=1e-6),
      "warmup + cosine schedule")
check(abs(parts["norm"] - 5.0) < 1e-6 and np.allclose(parts["clipped"], [0.6, 0.8], rtol=1e-5),
      "clipping by global norm (norm 5 -> 1)")
t = load_file(f"{d}/t.safetensors")
check(np.array_equal(t["w"], np.arange(1, 7, dtype=np.float32).reshape(2, 3))
      and t["b"].shape == (3,) and parts["roundtrip"],
      "safetensors: written, read back, and readable by the safetensors package")
png = open(f"{d}/plot.png", "rb").read()
w, h = struct.unpack(">II", png[16:24])
idat = png[png.index(b"IDAT") + 4:png.index(b"IEND") - 8]
raw = zlib.decompress(idat)
check(png[:8] == b"\x89PNG\r\n\x1a\n" and len(raw) == h * (1 + 3 * w),
      f"the loss plot is a valid {w}x{h} PNG")
finish()

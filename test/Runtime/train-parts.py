# RUN: rm -rf %t && mkdir -p %t && moert-train-test %t > %t/parts.json
# RUN: %python %s %t
#
# libmoert's training-loop parts against independent implementations:
# the compiled AdamW step's scalars and the warmup + cosine schedule against
# their formulas (the update itself: test/python/adamw.py), the safetensors file through the safetensors package, the loss
# plot through zlib (a valid PNG of the stated size).
import json
import math
import struct
import sys
import zlib

import numpy as np
from safetensors.numpy import load_file
from checks import check, finish

d = sys.argv[1]
parts = json.load(open(f"{d}/parts.json"))


def scalars(t, lr, clip, b1=0.9, b2=0.95, eps=1e-8, wd=0.1):
    return [lr / (1 - b1 ** t), math.sqrt(1 - b2 ** t), 1 - lr * wd, b1, b2, eps, clip, lr]


check(np.allclose(parts["adamw_scalars_t1"], scalars(1, 1e-2, 1.0), rtol=1e-7, atol=0)
      and np.allclose(parts["adamw_scalars_t5"], scalars(5, 3e-4, 0.0), rtol=1e-7, atol=0),
      "the AdamW step's scalars (bias corrections, decay, clip)")


def lr(s, warmup=3, total=10, peak=1.0, floor=0.1):
    if s < warmup:
        return peak * (s + 1) / warmup
    if s >= total:
        return peak * floor
    prog = (s - warmup) / (total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * prog)))


check(np.allclose(parts["lr"], [lr(s) for s in range(12)], rtol=1e-6),
      "warmup + cosine schedule")
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

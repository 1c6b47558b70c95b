"""Run with PYTHONPATH=<pip --target dir> of a pure-Python install."""
import glob
import os
import sys
import tempfile

import numpy as np

import moe_mlir
from moe_mlir import hf, mx

where = os.path.dirname(moe_mlir.__file__)
print("installed in target:", where.startswith(sys.argv[1]))
print("extension:", "present" if glob.glob(os.path.join(where, "_mlir*")) else "absent")
print("license:", any("LICENSE" in f for f in glob.glob(os.path.join(sys.argv[1], "*.dist-info", "**"),
                                                     recursive=True)))
with tempfile.TemporaryDirectory() as d:
    w = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 8
    hf.write_model(d, {"m.experts.gate_up_proj": w[:, :2], "m.experts.down_proj": w}, {},
                   max_shard_size=40)
    back = hf.read_weights(d)
    print("hf round trip:", np.array_equal(back["m.experts.down_proj"], w)
          and np.array_equal(back["m.experts.gate_up_proj"], w[:, :2]))
x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
print("mx round trip:", bool(np.all(np.isfinite(mx.dequantize(*mx.quantize(x))))))
try:
    moe_mlir.Module
    print("Module: available")
except ImportError as err:
    print("Module: ImportError:", str(err)[:60])

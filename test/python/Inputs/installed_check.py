"""Run with PYTHONPATH=<pip --target dir>: the installed package works."""
import os
import sys

import moe_mlir

where = os.path.dirname(moe_mlir.__file__)
print("installed in target:", where.startswith(sys.argv[1]))
m = moe_mlir.Module.parse("""
func.func @f(%h: tensor<2x8xf32>) -> tensor<2x4xf32> {
  %a = moe.swiglu %h : tensor<2x8xf32> -> tensor<2x4xf32>
  return %a : tensor<2x4xf32>
}""")
m.run("builtin.module(convert-moe-to-linalg)")
print("lowered:", "moe." not in str(m))

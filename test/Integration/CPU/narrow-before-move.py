# RUN: %python %s
#
# -moe-hoist-quantize's bf16 rewrites must not change a result: rows
# narrowed to bf16 after a dispatch are narrowed before it (the dispatch then
# moves bf16 rows), and the fused MLP's backward with gemm_type(bf16) reads
# those bf16 rows instead of rounding the f32 ones itself. The narrowed
# rows (zeros in the padding), the data gradient and both weight gradients
# of a layer are
# compared bit for bit with the program left as it was, on random inputs,
# with padded groups and without, beside the narrowed rows themselves.
import sys

import numpy as np

from moe_mlir import tools


def hexes(a):
    return ", ".join("0x%08X" % v for v in np.asarray(a, np.float32).view(np.uint32).ravel())


def bits_of(name, shape):
    n = len(shape)
    maps = ", ".join(["affine_map<(" + ", ".join(f"d{i}" for i in range(n)) + ") -> (" +
                      ", ".join(f"d{i}" for i in range(n)) + ")>"] * 2)
    t = "x".join(map(str, shape))
    return f"""  %e_{name} = tensor.empty() : tensor<{t}xi32>
  %b_{name} = linalg.generic {{indexing_maps = [{maps}], iterator_types = [{", ".join(['"parallel"'] * n)}]}}
      ins(%{name} : tensor<{t}xf32>) outs(%e_{name} : tensor<{t}xi32>) {{
  ^bb0(%v: f32, %out: i32):
    %b = arith.bitcast %v : f32 to i32
    linalg.yield %b : i32
  }} -> tensor<{t}xi32>
  %u_{name} = tensor.cast %b_{name} : tensor<{t}xi32> to tensor<*xi32>
  call @printMemrefI32(%u_{name}) : (tensor<*xi32>) -> ()
"""


def program(rng, T, H, E, F, K, pad):
    x = rng.standard_normal((T, H)).astype(np.float32)
    idx = rng.integers(0, E, size=(T, K)).astype(np.int32)
    w1 = (rng.standard_normal((E, H, 2 * F)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((E, F, H)) * 0.2).astype(np.float32)
    rows = ((T * K + E * (pad - 1)) // pad * pad + 31) // 32 * 32
    dy = rng.standard_normal((rows, H)).astype(np.float32)
    idx_list = ", ".join(str(v) for v in idx.ravel())
    ident = "affine_map<(i, j) -> (i, j)>"
    return f"""
func.func private @printMemrefI32(tensor<*xi32>)
func.func @main() {{
  %xv = arith.constant dense<[{hexes(x)}]> : tensor<{T*H}xf32>
  %x = tensor.expand_shape %xv [[0, 1]] output_shape [{T}, {H}] : tensor<{T*H}xf32> into tensor<{T}x{H}xf32>
  %iv = arith.constant dense<[{idx_list}]> : tensor<{T*K}xi32>
  %idx = tensor.expand_shape %iv [[0, 1]] output_shape [{T}, {K}] : tensor<{T*K}xi32> into tensor<{T}x{K}xi32>
  %w1v = arith.constant dense<[{hexes(w1)}]> : tensor<{E*H*2*F}xf32>
  %w1 = tensor.expand_shape %w1v [[0, 1, 2]] output_shape [{E}, {H}, {2*F}] : tensor<{E*H*2*F}xf32> into tensor<{E}x{H}x{2*F}xf32>
  %w2v = arith.constant dense<[{hexes(w2)}]> : tensor<{E*F*H}xf32>
  %w2 = tensor.expand_shape %w2v [[0, 1, 2]] output_shape [{E}, {F}, {H}] : tensor<{E*F*H}xf32> into tensor<{E}x{F}x{H}xf32>
  %dyv = arith.constant dense<[{hexes(dy)}]> : tensor<{rows*H}xf32>
  %dy = tensor.expand_shape %dyv [[0, 1]] output_shape [{rows}, {H}] : tensor<{rows*H}xf32> into tensor<{rows}x{H}xf32>
  %s, %o, %c, %p = moe.dispatch %x, %idx experts({E}) pad_to({pad})
      : tensor<{T}x{H}xf32>, tensor<{T}x{K}xi32> -> tensor<{rows}x{H}xf32>, tensor<{E+1}xi32>, tensor<{E}xi32>, tensor<{T}x{K}xi32>
  %en = tensor.empty() : tensor<{rows}x{H}xbf16>
  %n = linalg.generic {{indexing_maps = [{ident}, {ident}], iterator_types = ["parallel", "parallel"]}}
      ins(%s : tensor<{rows}x{H}xf32>) outs(%en : tensor<{rows}x{H}xbf16>) {{
    ^bb0(%in: f32, %out: bf16):
      %t = arith.truncf %in : f32 to bf16
      linalg.yield %t : bf16
  }} -> tensor<{rows}x{H}xbf16>
  %y = arith.extf %n : tensor<{rows}x{H}xbf16> to tensor<{rows}x{H}xf32>
  %dx, %dw1, %dw2 = moe.grouped_mlp_backward %s, %w1, %w2, %o, %dy gemm_type(bf16)
      : tensor<{rows}x{H}xf32>, tensor<{E}x{H}x{2*F}xf32>, tensor<{E}x{F}x{H}xf32>, tensor<{E+1}xi32>, tensor<{rows}x{H}xf32>
      -> tensor<{rows}x{H}xf32>, tensor<{E}x{H}x{2*F}xf32>, tensor<{E}x{F}x{H}xf32>
{bits_of("y", (rows, H))}{bits_of("dx", (rows, H))}{bits_of("dw1", (E, H, 2 * F))}{bits_of("dw2", (E, F, H))}  return
}}
"""


def main():
    rng = np.random.default_rng(5)
    failed = 0
    for case in (dict(T=24, H=32, E=4, F=32, K=2, pad=1), dict(T=40, H=64, E=8, F=32, K=3, pad=8)):
        src = program(rng, **case)
        hoisted = tools.moe_opt(src, "--moe-hoist-quantize")
        if "moe.dispatch %" not in hoisted or "xbf16>, tensor<" not in hoisted.split("moe.dispatch", 1)[1].split("\n", 1)[0]:
            print(f"FAIL {case}: the dispatch does not move bf16 rows")
            failed += 1
            continue
        ref, got = tools.run_cpu(src), tools.run_cpu(hoisted)
        same = len(ref) == 4 and all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(ref, got))
        failed += not same
        print(f"{'ok' if same else 'MISMATCH'}: {case} (rows, data and weight gradients, "
              f"{sum(a.size for a in ref)} values)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

# RUN: %python %s
#
# -moe-expert-parallel with ep-size=1 (every exchange over one rank) must not
# change a layer's result: the sharded program (global dispatch, all_to_all
# into groups by local expert, padded where the layer pads, expert MLP on
# those groups, all_to_all back out of them, combine) is
# compared bit for bit with the original on random inputs, for plain f32
# experts, padded groups, a capacity factor, MXFP8 weights quantized in the
# graph and the fused grouped MLP. (The one freedom the rewrite has is the
# sign of zero: an exact 0 may come back as +0; compared as values there.)
import sys

import numpy as np

from moe_mlir import tools


def f32(a):
    return ", ".join("0x%08X" % v for v in np.asarray(a, np.float32).view(np.uint32).ravel())


def layer(rng, T, H, E, F, K, pad, capacity, mx, fused):
    x = rng.standard_normal((T, H)).astype(np.float32)
    logits = rng.standard_normal((T, E)).astype(np.float32)
    w1 = (rng.standard_normal((E, H, 2 * F)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((E, F, H)) * 0.2).astype(np.float32)
    copies = T * K
    if capacity:
        c = int(np.ceil(capacity * copies / E))
        rows = min((copies + E * (pad - 1)) // pad * pad, E * ((c + pad - 1) // pad * pad))
    else:
        rows = (copies + E * (pad - 1)) // pad * pad
    rows = (rows + 31) // 32 * 32
    cap = f" capacity_factor({capacity})" if capacity else ""
    if mx:
        w1t, w2t = f"!moe.mx<{E}x{H}x{2*F}xf8E4M3FN, axis = 1>", f"!moe.mx<{E}x{F}x{H}xf8E4M3FN, axis = 1>"
        quant = f"""  %q1 = moe.quantize %w1 : tensor<{E}x{H}x{2*F}xf32> -> {w1t}
  %q2 = moe.quantize %w2 : tensor<{E}x{F}x{H}xf32> -> {w2t}
"""
        a1, a2 = "%q1", "%q2"
    else:
        w1t, w2t = f"tensor<{E}x{H}x{2*F}xf32>", f"tensor<{E}x{F}x{H}xf32>"
        quant, a1, a2 = "", "%w1", "%w2"
    if fused:
        experts = f"""  %y = moe.grouped_mlp %s, {a1}, {a2}, %o : tensor<{rows}x{H}xf32>, {w1t}, {w2t}, tensor<{E+1}xi32> -> tensor<{rows}x{H}xf32>
"""
    else:
        experts = f"""  %h = moe.grouped_matmul %s, {a1}, %o : tensor<{rows}x{H}xf32>, {w1t}, tensor<{E+1}xi32> -> tensor<{rows}x{2*F}xf32>
  %a = moe.swiglu %h : tensor<{rows}x{2*F}xf32> -> tensor<{rows}x{F}xf32>
  %y = moe.grouped_matmul %a, {a2}, %o : tensor<{rows}x{F}xf32>, {w2t}, tensor<{E+1}xi32> -> tensor<{rows}x{H}xf32>
"""
    return f"""
func.func private @printMemrefI32(tensor<*xi32>)
func.func @layer(%x: tensor<{T}x{H}xf32>, %logits: tensor<{T}x{E}xf32>,
                 %w1: tensor<{E}x{H}x{2*F}xf32>, %w2: tensor<{E}x{F}x{H}xf32>) -> tensor<{T}x{H}xf32> {{
  %idx, %w = moe.router %logits top_k({K}) softmax norm_topk_prob
      : tensor<{T}x{E}xf32> -> tensor<{T}x{K}xi32>, tensor<{T}x{K}xf32>
  %s, %o, %c, %p = moe.dispatch %x, %idx experts({E}){cap} pad_to({pad})
      : tensor<{T}x{H}xf32>, tensor<{T}x{K}xi32> -> tensor<{rows}x{H}xf32>, tensor<{E+1}xi32>, tensor<{E}xi32>, tensor<{T}x{K}xi32>
{quant}{experts}  %out = moe.combine %y, %w, %p : tensor<{rows}x{H}xf32>, tensor<{T}x{K}xf32>, tensor<{T}x{K}xi32> -> tensor<{T}x{H}xf32>
  return %out : tensor<{T}x{H}xf32>
}}
func.func @main() {{
  %xv = arith.constant dense<[{f32(x)}]> : tensor<{T*H}xf32>
  %x = tensor.expand_shape %xv [[0, 1]] output_shape [{T}, {H}] : tensor<{T*H}xf32> into tensor<{T}x{H}xf32>
  %lv = arith.constant dense<[{f32(logits)}]> : tensor<{T*E}xf32>
  %l = tensor.expand_shape %lv [[0, 1]] output_shape [{T}, {E}] : tensor<{T*E}xf32> into tensor<{T}x{E}xf32>
  %w1v = arith.constant dense<[{f32(w1)}]> : tensor<{E*H*2*F}xf32>
  %w1 = tensor.expand_shape %w1v [[0, 1, 2]] output_shape [{E}, {H}, {2*F}] : tensor<{E*H*2*F}xf32> into tensor<{E}x{H}x{2*F}xf32>
  %w2v = arith.constant dense<[{f32(w2)}]> : tensor<{E*F*H}xf32>
  %w2 = tensor.expand_shape %w2v [[0, 1, 2]] output_shape [{E}, {F}, {H}] : tensor<{E*F*H}xf32> into tensor<{E}x{F}x{H}xf32>
  %y = call @layer(%x, %l, %w1, %w2) : (tensor<{T}x{H}xf32>, tensor<{T}x{E}xf32>, tensor<{E}x{H}x{2*F}xf32>, tensor<{E}x{F}x{H}xf32>) -> tensor<{T}x{H}xf32>
  %e = tensor.empty() : tensor<{T}x{H}xi32>
  %bits = linalg.generic {{indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>],
                          iterator_types = ["parallel", "parallel"]}}
      ins(%y : tensor<{T}x{H}xf32>) outs(%e : tensor<{T}x{H}xi32>) {{
  ^bb0(%v: f32, %o: i32):
    %b = arith.bitcast %v : f32 to i32
    linalg.yield %b : i32
  }} -> tensor<{T}x{H}xi32>
  %u = tensor.cast %bits : tensor<{T}x{H}xi32> to tensor<*xi32>
  call @printMemrefI32(%u) : (tensor<*xi32>) -> ()
  return
}}
"""


def main():
    rng = np.random.default_rng(3)
    failed = 0
    cases = [dict(T=24, H=32, E=8, F=32, K=2, pad=1, capacity=None, mx=False, fused=False),
             dict(T=40, H=32, E=4, F=32, K=2, pad=8, capacity=None, mx=False, fused=True),
             dict(T=48, H=32, E=8, F=32, K=3, pad=4, capacity=0.75, mx=False, fused=False),
             dict(T=32, H=64, E=4, F=32, K=2, pad=32, capacity=None, mx=True, fused=True)]
    for case in cases:
        src = layer(rng, **case)
        sharded = tools.moe_opt(src, "--moe-expert-parallel=ep-size=1")
        if "moe.all_to_all" not in sharded:
            print(f"FAIL {case}: the layer was not sharded")
            failed += 1
            continue
        as_f32 = lambda bits: (bits.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
        ref = as_f32(tools.run_cpu(src)[0])
        got = as_f32(tools.run_cpu(sharded)[0])
        # Bit for bit, except that an exact zero may change sign.
        same = ref.shape == got.shape and np.array_equal(
            np.where(ref == 0, 0, ref.view(np.uint32)), np.where(got == 0, 0, got.view(np.uint32)))
        failed += not same
        print(f"{'ok' if same else 'MISMATCH'}: {case} ({ref.size} values, max |diff| "
              f"{np.max(np.abs(ref - got)) if ref.shape == got.shape else 'shape'})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

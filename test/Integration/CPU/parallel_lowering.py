# RUN: %python %s
#
# The data-parallel lowering of router, dispatch and the grouped matmuls
# (what GPUs run) against the reference lowering, on random routings large
# enough to span many blocks of copies: uneven and empty experts, capacity
# drops, padding, out-of-range indices, ties and NaN logits; and an expert
# computation (dispatch, MXFP8 and blockwise FP8 round trips, grouped GEMMs,
# SwiGLU, combine)
# whose rows past offsets[E] the parallel lowering leaves uncomputed (live
# rows) against the reference computing all; and tokens quantized before
# the dispatch (MX rows moved with their scales) against the dispatched
# rows quantized. Every printed value must be identical.
import sys

import numpy as np

from moe_mlir import tools


def f32(a):
    return ", ".join("0x%08X" % v for v in np.asarray(a, np.float32).view(np.uint32).ravel())


def program(rng, tokens, k, experts, hidden, n, pad, capacity):
    logits = rng.standard_normal((tokens, experts)).astype(np.float32)
    logits[rng.random((tokens, experts)) < 0.05] = 0.5      # ties
    logits[rng.random((tokens, experts)) < 0.01] = np.nan   # NaN scores
    idx = rng.integers(0, experts, (tokens, k))
    idx[rng.random((tokens, k)) < 0.3] = 1                   # a hot expert
    idx[rng.random((tokens, k)) < 0.02] = experts + 3        # out of range
    idx[:, :][idx == 2] = 0                                  # expert 2 empty
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    w = rng.standard_normal((experts, hidden, n)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(experts)).astype(np.float32)  # a selection bias
    copies = tokens * k
    cap = f" capacity_factor({capacity})" if capacity else ""
    if capacity:
        c = int(np.ceil(capacity * copies / experts))
        rows = min((copies + experts * (pad - 1)) // pad * pad,
                   experts * ((c + pad - 1) // pad * pad))
    else:
        rows = (copies + experts * (pad - 1)) // pad * pad
    T, K, E, H, N, R = tokens, k, experts, hidden, n, rows
    w2 = rng.standard_normal((E, H, 2 * N)).astype(np.float32)
    w3 = rng.standard_normal((E, N, H)).astype(np.float32)
    # With whole MX blocks along the hidden dimension, the rows go through
    # MXFP8 first, then blockwise FP8 in 1 x 128 tiles (a partial one: H is
    # below 128) (quantize and dequantize, all row-local).
    if H % 32 == 0:
        fp8 = f"!moe.fp8block<{R}x{H}xf8E4M3FN, block = [1, 128]>"
        mx = (f"%q5 = moe.quantize %s5 : tensor<{R}x{H}xf32> -> !moe.mx<{R}x{H}xf8E4M3FN, axis = 1>\n"
              f"  %m5 = moe.dequantize %q5 : !moe.mx<{R}x{H}xf8E4M3FN, axis = 1> -> tensor<{R}x{H}xf32>\n"
              f"  %b5 = moe.quantize %m5 : tensor<{R}x{H}xf32> -> {fp8}\n"
              f"  %g5 = moe.dequantize %b5 : {fp8} -> tensor<{R}x{H}xf32>")
    else:
        mx = "%g5 = tensor.cast %s5 : tensor<{R}x{H}xf32> to tensor<{R}x{H}xf32>".format(R=R, H=H)
    # And the tokens quantized before the dispatch (what -moe-hoist-quantize
    # makes): the same bytes as quantizing the dispatched rows, and the same
    # layer output when the rows past offsets[E] are left out.
    mx_dispatch = ""
    if H % 32 == 0:
        mxt = f"!moe.mx<{R}x{H}xf8E4M3FN, axis = 1>"
        bytes_of = lambda v, n, cols, ty: (
            f"  %{n}b = arith.bitcast %{v} : tensor<{R}x{cols}x{ty}> to tensor<{R}x{cols}xi8>\n"
            f"  %{n}w = arith.extui %{n}b : tensor<{R}x{cols}xi8> to tensor<{R}x{cols}xi32>\n"
            f"  %{n}c = tensor.cast %{n}w : tensor<{R}x{cols}xi32> to tensor<?x?xi32>\n"
            f"  call @pi2(%{n}c) : (tensor<?x?xi32>) -> ()\n")
        mx_dispatch = (
            f"  %qx = moe.quantize %x : tensor<{T}x{H}xf32> -> !moe.mx<{T}x{H}xf8E4M3FN, axis = 1>\n"
            f"  %q6, %off6, %cnt6, %pos6 = moe.dispatch %qx, %ix experts({E}){cap} pad_to({pad})\n"
            f"      : !moe.mx<{T}x{H}xf8E4M3FN, axis = 1>, tensor<{T}x{K}xi32> -> {mxt}, tensor<{E+1}xi32>, tensor<{E}xi32>, tensor<{T}x{K}xi32>\n"
            f"  %m6 = moe.dequantize %q6 : {mxt} -> tensor<{R}x{H}xf32>\n"
            f"  %b6 = moe.quantize %m6 : tensor<{R}x{H}xf32> -> {fp8}\n"
            f"  %g6 = moe.dequantize %b6 : {fp8} -> tensor<{R}x{H}xf32>\n"
            f"  %h6 = moe.grouped_matmul %g6, %w2, %off6 : tensor<{R}x{H}xf32>, tensor<{E}x{H}x{2*N}xf32>, tensor<{E+1}xi32> -> tensor<{R}x{2*N}xf32>\n"
            f"  %a6 = moe.swiglu %h6 : tensor<{R}x{2*N}xf32> -> tensor<{R}x{N}xf32>\n"
            f"  %y6 = moe.grouped_matmul %a6, %w3, %off6 : tensor<{R}x{N}xf32>, tensor<{E}x{N}x{H}xf32>, tensor<{E+1}xi32> -> tensor<{R}x{H}xf32>\n"
            f"  %o6 = moe.combine %y6, %wt, %pos6 : tensor<{R}x{H}xf32>, tensor<{T}x{K}xf32>, tensor<{T}x{K}xi32> -> tensor<{T}x{H}xf32>\n"
            f"  %c8 = tensor.cast %o6 : tensor<{T}x{H}xf32> to tensor<?x?xf32>\n"
            f"  call @pf(%c8) : (tensor<?x?xf32>) -> ()\n"
            # Every byte of both forms, padding and tail rows included.
            f"  %q7, %off7, %cnt7, %pos7 = moe.dispatch %qx, %ix experts({E}){cap} pad_to({pad})\n"
            f"      : !moe.mx<{T}x{H}xf8E4M3FN, axis = 1>, tensor<{T}x{K}xi32> -> {mxt}, tensor<{E+1}xi32>, tensor<{E}xi32>, tensor<{T}x{K}xi32>\n"
            f"  %d7, %sc7 = moe.mx_unpack %q7 : {mxt} -> tensor<{R}x{H}xf8E4M3FN>, tensor<{R}x{H//32}xf8E8M0FNU>\n"
            f"  %qs = moe.quantize %s : tensor<{R}x{H}xf32> -> {mxt}\n"
            f"  %d8, %sc8 = moe.mx_unpack %qs : {mxt} -> tensor<{R}x{H}xf8E4M3FN>, tensor<{R}x{H//32}xf8E8M0FNU>\n"
            + bytes_of("d7", "p7", H, "f8E4M3FN") + bytes_of("sc7", "r7", H // 32, "f8E8M0FNU")
            + bytes_of("d8", "p8", H, "f8E4M3FN") + bytes_of("sc8", "r8", H // 32, "f8E8M0FNU"))
    return logits, bias, f"""
func.func private @printMemrefF32(tensor<*xf32>)
func.func private @printMemrefI32(tensor<*xi32>)
func.func @pf(%t: tensor<?x?xf32>) {{
  %u = tensor.cast %t : tensor<?x?xf32> to tensor<*xf32>
  call @printMemrefF32(%u) : (tensor<*xf32>) -> ()
  return
}}
func.func @pi(%t: tensor<?xi32>) {{
  %u = tensor.cast %t : tensor<?xi32> to tensor<*xi32>
  call @printMemrefI32(%u) : (tensor<*xi32>) -> ()
  return
}}
func.func @pi2(%t: tensor<?x?xi32>) {{
  %u = tensor.cast %t : tensor<?x?xi32> to tensor<*xi32>
  call @printMemrefI32(%u) : (tensor<*xi32>) -> ()
  return
}}
func.func @main() {{
  %l = arith.constant dense<[{f32(logits)}]> : tensor<{T*E}xf32>
  %logits = tensor.expand_shape %l [[0, 1]] output_shape [{T}, {E}] : tensor<{T*E}xf32> into tensor<{T}x{E}xf32>
  %i, %wt = moe.router %logits top_k({K}) softmax norm_topk_prob : tensor<{T}x{E}xf32> -> tensor<{T}x{K}xi32>, tensor<{T}x{K}xf32>
  %i2, %wt2 = moe.router %logits top_k({K}) softmax softmax_after_topk : tensor<{T}x{E}xf32> -> tensor<{T}x{K}xi32>, tensor<{T}x{K}xf32>
  %i3, %wt3 = moe.router %logits top_k({K}) sigmoid norm_topk_prob : tensor<{T}x{E}xf32> -> tensor<{T}x{K}xi32>, tensor<{T}x{K}xf32>
  %bias = arith.constant dense<[{f32(bias)}]> : tensor<{E}xf32>
  %i4, %wt4 = moe.router %logits bias(%bias : tensor<{E}xf32>) top_k({K}) sigmoid norm_topk_prob : tensor<{T}x{E}xf32> -> tensor<{T}x{K}xi32>, tensor<{T}x{K}xf32>
  %idx = arith.constant dense<{np.array2string(idx.ravel(), separator=',', threshold=10**9).replace(chr(10), '')}> : tensor<{T*K}xi32>
  %ix = tensor.expand_shape %idx [[0, 1]] output_shape [{T}, {K}] : tensor<{T*K}xi32> into tensor<{T}x{K}xi32>
  %xv = arith.constant dense<[{f32(x)}]> : tensor<{T*H}xf32>
  %x = tensor.expand_shape %xv [[0, 1]] output_shape [{T}, {H}] : tensor<{T*H}xf32> into tensor<{T}x{H}xf32>
  %s, %off, %cnt, %pos = moe.dispatch %x, %ix experts({E}){cap} pad_to({pad})
      : tensor<{T}x{H}xf32>, tensor<{T}x{K}xi32> -> tensor<{R}x{H}xf32>, tensor<{E+1}xi32>, tensor<{E}xi32>, tensor<{T}x{K}xi32>
  %wv = arith.constant dense<[{f32(w)}]> : tensor<{E*H*N}xf32>
  %w = tensor.expand_shape %wv [[0, 1, 2]] output_shape [{E}, {H}, {N}] : tensor<{E*H*N}xf32> into tensor<{E}x{H}x{N}xf32>
  %y = moe.grouped_matmul %s, %w, %off : tensor<{R}x{H}xf32>, tensor<{E}x{H}x{N}xf32>, tensor<{E+1}xi32> -> tensor<{R}x{N}xf32>
  %dw = moe.grouped_matmul_wgrad %s, %y, %off : tensor<{R}x{H}xf32>, tensor<{R}x{N}xf32>, tensor<{E+1}xi32> -> tensor<{E}x{H}x{N}xf32>
  %dwf = tensor.collapse_shape %dw [[0, 1], [2]] : tensor<{E}x{H}x{N}xf32> into tensor<{E*H}x{N}xf32>
  // An expert computation read only through groups and positions: its rows
  // past offsets[E] are left unspecified (live rows), the result is not.
  %s5, %off5, %cnt5, %pos5 = moe.dispatch %x, %ix experts({E}){cap} pad_to({pad})
      : tensor<{T}x{H}xf32>, tensor<{T}x{K}xi32> -> tensor<{R}x{H}xf32>, tensor<{E+1}xi32>, tensor<{E}xi32>, tensor<{T}x{K}xi32>
  {mx}
  %w2v = arith.constant dense<[{f32(w2)}]> : tensor<{E*H*2*N}xf32>
  %w2 = tensor.expand_shape %w2v [[0, 1, 2]] output_shape [{E}, {H}, {2*N}] : tensor<{E*H*2*N}xf32> into tensor<{E}x{H}x{2*N}xf32>
  %w3v = arith.constant dense<[{f32(w3)}]> : tensor<{E*N*H}xf32>
  %w3 = tensor.expand_shape %w3v [[0, 1, 2]] output_shape [{E}, {N}, {H}] : tensor<{E*N*H}xf32> into tensor<{E}x{N}x{H}xf32>
  %h5 = moe.grouped_matmul %g5, %w2, %off5 : tensor<{R}x{H}xf32>, tensor<{E}x{H}x{2*N}xf32>, tensor<{E+1}xi32> -> tensor<{R}x{2*N}xf32>
  %a5 = moe.swiglu %h5 : tensor<{R}x{2*N}xf32> -> tensor<{R}x{N}xf32>
  %y5 = moe.grouped_matmul %a5, %w3, %off5 : tensor<{R}x{N}xf32>, tensor<{E}x{N}x{H}xf32>, tensor<{E+1}xi32> -> tensor<{R}x{H}xf32>
  %o5 = moe.combine %y5, %wt, %pos5 : tensor<{R}x{H}xf32>, tensor<{T}x{K}xf32>, tensor<{T}x{K}xi32> -> tensor<{T}x{H}xf32>
  %a = tensor.cast %i : tensor<{T}x{K}xi32> to tensor<?x?xi32>
  call @pi2(%a) : (tensor<?x?xi32>) -> ()
  %b = tensor.cast %wt : tensor<{T}x{K}xf32> to tensor<?x?xf32>
  call @pf(%b) : (tensor<?x?xf32>) -> ()
  %a2 = tensor.cast %i2 : tensor<{T}x{K}xi32> to tensor<?x?xi32>
  call @pi2(%a2) : (tensor<?x?xi32>) -> ()
  %b2 = tensor.cast %wt2 : tensor<{T}x{K}xf32> to tensor<?x?xf32>
  call @pf(%b2) : (tensor<?x?xf32>) -> ()
  %a3 = tensor.cast %i3 : tensor<{T}x{K}xi32> to tensor<?x?xi32>
  call @pi2(%a3) : (tensor<?x?xi32>) -> ()
  %b3 = tensor.cast %wt3 : tensor<{T}x{K}xf32> to tensor<?x?xf32>
  call @pf(%b3) : (tensor<?x?xf32>) -> ()
  %a4 = tensor.cast %i4 : tensor<{T}x{K}xi32> to tensor<?x?xi32>
  call @pi2(%a4) : (tensor<?x?xi32>) -> ()
  %b4 = tensor.cast %wt4 : tensor<{T}x{K}xf32> to tensor<?x?xf32>
  call @pf(%b4) : (tensor<?x?xf32>) -> ()
  %c1 = tensor.cast %off : tensor<{E+1}xi32> to tensor<?xi32>
  call @pi(%c1) : (tensor<?xi32>) -> ()
  %c2 = tensor.cast %cnt : tensor<{E}xi32> to tensor<?xi32>
  call @pi(%c2) : (tensor<?xi32>) -> ()
  %c3 = tensor.cast %pos : tensor<{T}x{K}xi32> to tensor<?x?xi32>
  call @pi2(%c3) : (tensor<?x?xi32>) -> ()
  %c4 = tensor.cast %s : tensor<{R}x{H}xf32> to tensor<?x?xf32>
  call @pf(%c4) : (tensor<?x?xf32>) -> ()
  %c5 = tensor.cast %y : tensor<{R}x{N}xf32> to tensor<?x?xf32>
  call @pf(%c5) : (tensor<?x?xf32>) -> ()
  %c6 = tensor.cast %dwf : tensor<{E*H}x{N}xf32> to tensor<?x?xf32>
  call @pf(%c6) : (tensor<?x?xf32>) -> ()
  %c7 = tensor.cast %o5 : tensor<{T}x{H}xf32> to tensor<?x?xf32>
  call @pf(%c7) : (tensor<?x?xf32>) -> ()
{mx_dispatch}  return
}}
"""


def main():
    rng = np.random.default_rng(7)
    names = ["router softmax idx", "router softmax w", "after-topk idx", "after-topk w",
             "sigmoid idx", "sigmoid w", "biased idx", "biased w", "offsets", "counts",
             "positions", "sorted",
             "grouped_matmul", "wgrad", "live-rows layer"]
    mx_names = ["mx-dispatch layer", "mx-dispatch data", "mx-dispatch scales",
                "quantized sorted data", "quantized sorted scales"]
    failed = 0
    for case in [dict(tokens=300, k=3, experts=7, hidden=4, n=3, pad=1, capacity=None),
                 dict(tokens=257, k=2, experts=9, hidden=3, n=2, pad=8, capacity=None),
                 dict(tokens=200, k=4, experts=6, hidden=2, n=2, pad=4, capacity=0.8),
                 dict(tokens=96, k=2, experts=5, hidden=32, n=4, pad=1, capacity=None),
                 dict(tokens=80, k=3, experts=6, hidden=64, n=4, pad=8, capacity=0.9)]:
        logits, bias, src = program(rng, **case)
        # The reference computes every row; the parallel lowering only the
        # live ones.
        ref = tools.run_cpu(tools.moe_opt(src, "--convert-moe-to-linalg=live-rows=false"))
        if "extract_slice" not in tools.moe_opt(src, "--convert-moe-to-linalg=parallel=true"):
            print(f"MISMATCH: no live-rows slices in the parallel lowering of {case}")
            failed += 1
        par = tools.run_cpu(src, parallel=True)
        expected = names + (mx_names if case["hidden"] % 32 == 0 else [])
        if len(ref) != len(expected) or len(par) != len(expected):
            print(f"MISMATCH: expected {len(expected)} printed tensors, got {len(ref)} and {len(par)}")
            failed += 1
            continue
        at = {n: i for i, n in enumerate(expected)}
        dropped = int((ref[at["positions"]] < 0).sum())
        print(f"{case}: {dropped} dropped copies, {int(ref[at['counts']].sum())} kept")
        # The selection bias against numpy: ranked by sigmoid + bias (NaN
        # last, lower index first on ties), weighted by the unbiased
        # sigmoid, normalized (to the 6 digits printed).
        k = case["k"]
        scores = (1 / (1 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
        rank = scores + bias
        want = np.array([sorted(range(len(r)), key=lambda e: (bool(np.isnan(r[e])),
                                                              0.0 if np.isnan(r[e]) else -r[e], e))[:k]
                         for r in rank])
        got = ref[at["biased idx"]].reshape(want.shape)
        picked = np.take_along_axis(scores, want, 1)
        weights = picked / picked.sum(1, keepdims=True)
        clean = ~np.isnan(weights).any(1)
        ok = np.array_equal(got, want) and np.allclose(
            ref[at["biased w"]].reshape(want.shape)[clean], weights[clean], rtol=1e-5, atol=1e-6)
        moved = int((got != ref[at["sigmoid idx"]].reshape(want.shape)).any(1).sum())
        failed += not ok or moved == 0
        print(f"{'ok' if ok and moved else 'MISMATCH'}: the selection bias picks by score + bias "
              f"and weighs by score, as numpy does ({moved} tokens routed elsewhere) {case}")
        if case["capacity"] and dropped == 0:
            print("MISMATCH: the capacity case dropped nothing; it tests nothing")
            failed += 1
        for name, a, b in zip(expected, ref, par):
            same = a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
            failed += not same
            print(f"{'ok' if same else 'MISMATCH'}: {name} {case}")
        if case["hidden"] % 32 == 0:
            # Quantized before or after the dispatch: the same layer output,
            # the same data and scale bytes (zero rows: all bytes 0).
            pairs = [("live-rows layer", "mx-dispatch layer"),
                     ("mx-dispatch data", "quantized sorted data"),
                     ("mx-dispatch scales", "quantized sorted scales")]
            for out in (ref, par):
                for a, b in pairs:
                    x, y = out[expected.index(a)], out[expected.index(b)]
                    same = x.shape == y.shape and np.array_equal(x, y, equal_nan=True)
                    failed += not same
                    print(f"{'ok' if same else 'MISMATCH'}: {a} == {b} {case}")
            if not (par[expected.index("mx-dispatch scales")] == 0).any():
                print("MISMATCH: no zero-row scales; the padding is untested")
                failed += 1
    print(f"{failed} mismatches")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

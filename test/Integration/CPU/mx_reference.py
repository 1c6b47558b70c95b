# RUN: %python %s
#
# MXFP8 quantize/dequantize of moe-opt's CPU pipeline against an independent
# reference built on numpy and ml_dtypes (float8_e4m3fn, float8_e5m2,
# float8_e8m0fnu), on random blocks of every kind: wide and narrow magnitude
# ranges, f32 subnormals, exact powers of two, values at and beyond the
# element maximum, zeros, NaN and Inf; E4M3 and E5M2; rceil and floor scales;
# rowwise and columnwise blocks. Every data byte, scale byte and dequantized
# value must match exactly (bit for bit). The reference is moe_mlir.mx
# (python/), written from the definition on top of ml_dtypes' casts.
import sys

import numpy as np

from moe_mlir import mx, tools

FORMATS = mx.FORMATS


def ref_quantize(x, fmt, mode):
    """x: float32 [nblocks, 32] -> (data bytes, scale bytes, dequantized f32)."""
    data, scales = mx.quantize(x, fmt, axis=1, mode=mode)
    return data, scales.ravel(), mx.dequantize(data, scales, fmt, axis=1)


def random_blocks(rng, n):
    blocks = []
    for i in range(n):
        kind = i % 8
        if kind == 0:    # wide dynamic range
            b = rng.standard_normal(32) * 2.0 ** rng.integers(-40, 40, 32)
        elif kind == 1:  # one magnitude, typical activations
            b = rng.standard_normal(32) * 10.0 ** rng.uniform(-6, 6)
        elif kind == 2:  # exact powers of two and their neighbours
            b = 2.0 ** rng.integers(-20, 20, 32) * rng.choice([1, -1, 1.75, 1.875, 1.0625], 32)
        elif kind == 3:  # f32 subnormals and tiny values
            b = rng.standard_normal(32) * 2.0 ** rng.integers(-149, -120, 32)
        elif kind == 4:  # at and beyond the element maximum
            b = rng.choice([448.0, 464.0, 480.0, 500.0, 57344.0, 61440.0, 1e30, -448.0], 32)
        elif kind == 5:  # zeros, with a few signed zeros
            b = np.zeros(32) * rng.choice([1, -1], 32)
        elif kind == 6:  # a NaN or an infinity inside normal data
            b = rng.standard_normal(32)
            b[rng.integers(0, 32)] = rng.choice([np.nan, np.inf, -np.inf])
        else:            # huge values near the f32 maximum
            b = rng.uniform(-3.4e38, 3.4e38, 32)
        blocks.append(b.astype(np.float32))
    return np.stack(blocks)


def f32_hex(a):
    return ", ".join("0x%08X" % v for v in a.astype(np.float32).view(np.uint32).ravel())


def program(x, fmt, mode, axis):
    """MLIR that quantizes x ([n, 32] blocks laid out along `axis`) and prints
    data bytes, scale bytes and the dequantized values' bits."""
    n = x.shape[0]
    shape = (n, 32) if axis == 1 else (32, n)
    arr = x if axis == 1 else x.T
    dims = "x".join(map(str, shape))
    sdims = f"{n}x1" if axis == 1 else f"1x{n}"
    mx = f"!moe.mx<{dims}x{fmt}, axis = {axis}>"
    return f"""
func.func private @printMemrefI32(tensor<*xi32>)
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @bits(%t: tensor<?x?x{fmt}>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d0 = tensor.dim %t, %c0 : tensor<?x?x{fmt}>
  %d1 = tensor.dim %t, %c1 : tensor<?x?x{fmt}>
  %e = tensor.empty(%d0, %d1) : tensor<?x?xi32>
  %r = linalg.generic {{indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}}
      ins(%t : tensor<?x?x{fmt}>) outs(%e : tensor<?x?xi32>) {{
  ^bb0(%a: {fmt}, %o: i32):
    %b = arith.bitcast %a : {fmt} to i8
    %x = arith.extui %b : i8 to i32
    linalg.yield %x : i32
  }} -> tensor<?x?xi32>
  %u = tensor.cast %r : tensor<?x?xi32> to tensor<*xi32>
  call @printMemrefI32(%u) : (tensor<*xi32>) -> ()
  return
}}
func.func @scale_bits(%t: tensor<?x?xf8E8M0FNU>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d0 = tensor.dim %t, %c0 : tensor<?x?xf8E8M0FNU>
  %d1 = tensor.dim %t, %c1 : tensor<?x?xf8E8M0FNU>
  %e = tensor.empty(%d0, %d1) : tensor<?x?xi32>
  %r = linalg.generic {{indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}}
      ins(%t : tensor<?x?xf8E8M0FNU>) outs(%e : tensor<?x?xi32>) {{
  ^bb0(%a: f8E8M0FNU, %o: i32):
    %b = arith.bitcast %a : f8E8M0FNU to i8
    %x = arith.extui %b : i8 to i32
    linalg.yield %x : i32
  }} -> tensor<?x?xi32>
  %u = tensor.cast %r : tensor<?x?xi32> to tensor<*xi32>
  call @printMemrefI32(%u) : (tensor<*xi32>) -> ()
  return
}}
func.func @main() {{
  %x = arith.constant dense<[{f32_hex(arr)}]> : tensor<{arr.size}xf32>
  %x2 = tensor.expand_shape %x [[0, 1]] output_shape [{shape[0]}, {shape[1]}] : tensor<{arr.size}xf32> into tensor<{dims}xf32>
  %q = moe.quantize %x2 scale({mode}) : tensor<{dims}xf32> -> {mx}
  %d, %s = moe.mx_unpack %q : {mx} -> tensor<{dims}x{fmt}>, tensor<{sdims}xf8E8M0FNU>
  %dd = tensor.cast %d : tensor<{dims}x{fmt}> to tensor<?x?x{fmt}>
  %ss = tensor.cast %s : tensor<{sdims}xf8E8M0FNU> to tensor<?x?xf8E8M0FNU>
  call @bits(%dd) : (tensor<?x?x{fmt}>) -> ()
  call @scale_bits(%ss) : (tensor<?x?xf8E8M0FNU>) -> ()
  %y = moe.dequantize %q : {mx} -> tensor<{dims}xf32>
  %e = tensor.empty() : tensor<{dims}xi32>
  %yb = linalg.generic {{indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}}
      ins(%y : tensor<{dims}xf32>) outs(%e : tensor<{dims}xi32>) {{
  ^bb0(%a: f32, %o: i32):
    %b = arith.bitcast %a : f32 to i32
    linalg.yield %b : i32
  }} -> tensor<{dims}xi32>
  %u = tensor.cast %yb : tensor<{dims}xi32> to tensor<*xi32>
  call @printMemrefI32(%u) : (tensor<*xi32>) -> ()
  return
}}
"""


def run(src):
    return [t.astype(np.int64) for t in tools.run_cpu(src)]


def main():
    rng = np.random.default_rng(20261130)
    failures = 0
    cases = 0
    for fmt in FORMATS:
        for mode in ("rceil", "floor"):
            for axis in (1, 0):
                x = random_blocks(rng, 64)
                data, scales, deq = ref_quantize(x, fmt, mode)
                got_data, got_scales, got_deq = run(program(x, fmt, mode, axis))
                if axis == 0:  # printed in [32, n] order
                    got_data = got_data.reshape(32, -1).T.ravel()
                    got_deq = got_deq.reshape(32, -1).T.ravel()
                got_deq = (got_deq & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
                want_deq = deq.ravel()
                same_deq = (got_deq.view(np.uint32) == want_deq.view(np.uint32)) | \
                           (np.isnan(got_deq) & np.isnan(want_deq))
                checks = [("data", got_data == data.ravel()),
                          ("scales", got_scales == scales.ravel()),
                          ("dequantized", same_deq)]
                for what, ok in checks:
                    cases += ok.size
                    if not ok.all():
                        failures += 1
                        i = int(np.argmin(ok))
                        print(f"FAIL {fmt} {mode} axis={axis} {what}: first mismatch at {i}"
                              f" (block {i // 32 if what != 'scales' else i}):"
                              f" x={x.ravel()[i] if what != 'scales' else x[i]}")
                print(f"{fmt} {mode} axis={axis}: "
                      f"{'ok' if all(ok.all() for _, ok in checks) else 'MISMATCH'}")
    print(f"{cases} values compared, {failures} mismatching groups")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

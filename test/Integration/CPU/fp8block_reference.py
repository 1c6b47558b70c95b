# RUN: %python %s
#
# Blockwise FP8 (!moe.fp8block) quantize/dequantize of moe-opt's CPU pipeline,
# sequential and data-parallel lowerings, against an independent numpy
# reference (moe_mlir.fp8block, on ml_dtypes' casts): 1 x 128 tiles along
# rows, 128 x 1 tiles along columns, 1 x 128 x 128 tiles of stacked weights,
# shapes that are not tile multiples (partial tiles), E4M3 and E5M2, f32 and
# power-of-two scales, values of every kind (wide ranges, subnormals, powers
# of two, beyond the element maximum, zeros, NaN and Inf, near the f32
# maximum). Every data byte, scale and dequantized value must match bit for
# bit.
import sys

import numpy as np

from moe_mlir import fp8block, tools


def values(rng, shape):
    """Random values, a different kind in every run of 37 elements."""
    x = np.empty(int(np.prod(shape)), np.float32)
    for start in range(0, x.size, 37):
        n = min(37, x.size - start)
        kind = (start // 37) % 8
        if kind == 0:
            v = rng.standard_normal(n) * 2.0 ** rng.integers(-40, 40, n)
        elif kind == 1:
            v = rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 6)
        elif kind == 2:
            v = 2.0 ** rng.integers(-20, 20, n) * rng.choice([1, -1, 1.75, 1.0625], n)
        elif kind == 3:
            v = rng.standard_normal(n) * 2.0 ** rng.integers(-149, -120, n)
        elif kind == 4:
            v = rng.choice([448.0, 464.0, 500.0, 57344.0, 61440.0, 1e30, -448.0], n)
        elif kind == 5:
            v = np.zeros(n) * rng.choice([1, -1], n)
        elif kind == 6:
            v = rng.standard_normal(n)
            if rng.integers(0, 3) == 0:
                v[rng.integers(0, n)] = rng.choice([np.nan, np.inf, -np.inf])
        else:
            v = rng.uniform(-3.4e38, 3.4e38, n)
        x[start:start + n] = v
    x = x.reshape(shape)
    # A whole region of zeros: all-zero tiles of every blocking.
    x[..., :1, :] = 0
    return x


def f32_hex(a):
    return ", ".join("0x%08X" % v for v in a.astype(np.float32).view(np.uint32).ravel())


def program(x, fmt, block, pow2):
    shape = x.shape
    rank = len(shape)
    dims = "x".join(map(str, shape))
    sdims = "x".join(str(-(-n // b)) for n, b in zip(shape, block))
    ty = (f"!moe.fp8block<{dims}x{fmt}, block = [{', '.join(map(str, block))}]"
          f"{', pow2' if pow2 else ''}>")
    d = ", ".join(f"d{i}" for i in range(rank))
    par = ", ".join(['"parallel"'] * rank)
    reassoc = "[" + ", ".join(str(i) for i in range(rank)) + "]"

    def bits(name, value, elt, cast):
        return f"""
  %{name}e = tensor.empty() : tensor<{value[1]}xi32>
  %{name}b = linalg.generic {{indexing_maps = [#id, #id], iterator_types = [{par}]}}
      ins(%{value[0]} : tensor<{value[1]}x{elt}>) outs(%{name}e : tensor<{value[1]}xi32>) {{
  ^bb0(%a: {elt}, %o: i32):
    {cast}
    linalg.yield %r : i32
  }} -> tensor<{value[1]}xi32>
  %{name}u = tensor.cast %{name}b : tensor<{value[1]}xi32> to tensor<*xi32>
  call @printMemrefI32(%{name}u) : (tensor<*xi32>) -> ()"""

    byte = "%c = arith.bitcast %a : " + fmt + " to i8\n    %r = arith.extui %c : i8 to i32"
    word = "%r = arith.bitcast %a : f32 to i32"
    return f"""
func.func private @printMemrefI32(tensor<*xi32>)
#id = affine_map<({d}) -> ({d})>
func.func @main() {{
  %x = arith.constant dense<[{f32_hex(x)}]> : tensor<{x.size}xf32>
  %x2 = tensor.expand_shape %x [{reassoc}] output_shape [{', '.join(map(str, shape))}] : tensor<{x.size}xf32> into tensor<{dims}xf32>
  %q = moe.quantize %x2 : tensor<{dims}xf32> -> {ty}
  %d, %s = moe.mx_unpack %q : {ty} -> tensor<{dims}x{fmt}>, tensor<{sdims}xf32>
{bits("data", ("d", dims), fmt, byte)}
{bits("scales", ("s", sdims), "f32", word)}
  %y = moe.dequantize %q : {ty} -> tensor<{dims}xf32>
{bits("deq", ("y", dims), "f32", word)}
  return
}}
"""


def as_f32(bits):
    return (bits.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def same(a, b):
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


CASES = [
    # (shape, block): rowwise, columnwise with a partial tile, weights.
    ((6, 384), (1, 128)),
    ((200, 3), (128, 1)),
    ((2, 136, 260), (1, 128, 128)),
]


def main():
    rng = np.random.default_rng(20261205)
    failures = cases = 0
    for shape, block in CASES:
        for fmt in fp8block.FORMATS:
            for pow2 in (False, True):
                x = values(rng, shape)
                data, scales = fp8block.quantize(x, block, fmt, pow2)
                deq = fp8block.dequantize(data, scales, block, fmt)
                for parallel in (False, True):
                    got = tools.run_cpu(program(x, fmt, block, pow2), parallel)
                    checks = [("data", got[0].astype(np.int64) == data.ravel()),
                              ("scales", same(as_f32(got[1]), scales.ravel())),
                              ("dequantized", same(as_f32(got[2]), deq.ravel()))]
                    ok_all = True
                    for what, ok in checks:
                        cases += ok.size
                        if not ok.all():
                            failures += 1
                            ok_all = False
                            i = int(np.argmin(ok))
                            print(f"FAIL {shape} {block} {fmt} pow2={pow2} "
                                  f"parallel={parallel} {what}: first mismatch at {i}")
                    print(f"{shape} {block} {fmt} pow2={pow2} parallel={parallel}: "
                          f"{'ok' if ok_all else 'MISMATCH'}")
    print(f"{cases} values compared, {failures} mismatching groups")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

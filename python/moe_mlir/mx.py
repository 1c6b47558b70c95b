"""MX block-scaled formats (MXFP8 E4M3 / E5M2) in numpy.

An implementation independent of the compiler's, written from the definition:
for every block of ``block`` values along ``axis``

* amax = max |x| (f32);
* e = ceil(log2(amax / max_elem)) for ``rceil`` (smallest e with
  amax <= max_elem * 2^e), or floor(log2(amax)) - emax_elem for ``floor``;
  clamped to [-127, 127]; all-zero blocks get e = -127; a NaN or Inf in the
  block gives the NaN scale (byte 0xFF) and elements converted with e = 0;
* elements: x * 2^-e in f32, saturated to +-max_elem, rounded to nearest even.

Dequantization is q * 2^e in f32.
"""

import math

import ml_dtypes
import numpy as np

#: element type name -> (numpy dtype, largest finite value, its exponent)
FORMATS = {
    "f8E4M3FN": (ml_dtypes.float8_e4m3fn, 448.0, 8),
    "f8E5M2": (ml_dtypes.float8_e5m2, 57344.0, 15),
}


def scale_exponent(amax, fmt="f8E4M3FN", mode="rceil"):
    """The shared exponent of a block with the given amax, or None (NaN scale)."""
    _, max_elem, emax = FORMATS[fmt]
    amax = float(amax)
    if math.isnan(amax) or math.isinf(amax):
        return None
    if amax == 0.0:
        return -127
    if mode == "floor":
        e = math.frexp(amax)[1] - 1 - emax
    elif mode == "rceil":
        e = math.ceil(math.log2(amax / max_elem)) - 2
        while amax > max_elem * 2.0**e:  # exact in double precision
            e += 1
    else:
        raise ValueError(f"unknown scale mode {mode!r} (rceil or floor)")
    return max(-127, min(127, e))


def quantize(x, fmt="f8E4M3FN", axis=-1, mode="rceil", block=32):
    """x (float array) -> (data as uint8 bits, scales as uint8 E8M0 bytes).

    ``data`` has x's shape; ``scales`` has x's shape with ``axis`` divided by
    ``block``. Raises ValueError when that dimension is not a multiple of
    ``block``.
    """
    dtype, max_elem, _ = FORMATS[fmt]
    x = np.asarray(x, dtype=np.float32)
    axis = axis % x.ndim
    if x.shape[axis] % block:
        raise ValueError(f"dimension {axis} has size {x.shape[axis]}, not a multiple of {block}")
    moved = np.moveaxis(x, axis, -1)
    blocks = moved.reshape(-1, block)
    data = np.empty(blocks.shape, np.uint8)
    scales = np.empty(blocks.shape[0], np.uint8)
    for i, b in enumerate(blocks):
        amax = math.nan if np.isnan(b).any() else float(np.max(np.abs(b)))
        e = scale_exponent(amax, fmt, mode)
        v = b * (np.float32(1.0) if e is None else np.float32(2.0**-e))
        v = np.where(np.isnan(v), v, np.clip(v, -max_elem, max_elem)).astype(np.float32)
        data[i] = v.astype(dtype).view(np.uint8)
        scales[i] = 255 if e is None else e + 127
    data = np.moveaxis(data.reshape(moved.shape), -1, axis)
    scale_shape = moved.shape[:-1] + (moved.shape[-1] // block,)
    scales = np.moveaxis(scales.reshape(scale_shape), -1, axis)
    return data, scales


def dequantize(data, scales, fmt="f8E4M3FN", axis=-1, block=32):
    """(uint8 data bits, uint8 scale bytes) -> float32 values q * 2^e."""
    dtype = FORMATS[fmt][0]
    data = np.asarray(data, np.uint8)
    axis = axis % data.ndim
    q = data.view(dtype).astype(np.float32)
    s = np.asarray(scales, np.uint8).astype(np.int32)
    factor = np.where(s == 255, np.float32(np.nan),
                      np.ldexp(np.float32(1.0), s - 127).astype(np.float32))
    factor = np.repeat(factor, block, axis=axis)
    with np.errstate(over="ignore"):
        return (q * factor).astype(np.float32)

"""Blockwise-scaled FP8 (Transformer Engine's Float8BlockScaling) in numpy.

An implementation independent of the compiler's, written from the definition
of ``moe.quantize`` to a ``!moe.fp8block`` type: the tensor is cut into tiles
of ``block`` (one size per dimension; the last tile along a dimension may be
partial), and for every tile, in f32:

* amax = max |x| (NaN if the tile holds a NaN);
* s = max_elem / amax rounded to nearest f32; 1 for an amax of 0, Inf or NaN;
  the largest finite f32 where the quotient overflows; with ``pow2``, s with
  its mantissa cleared (the largest power of two not above it);
* elements: x * s in f32, saturated to +-max_elem, rounded to nearest even
  (NaN stays NaN);
* the stored scale: 1 / s rounded to nearest f32.

Dequantization is q * stored scale in f32.
"""

import itertools

import numpy as np

from .mx import FORMATS  # noqa: F401 (also the formats of this module)


def tile_scale(amax, fmt="f8E4M3FN", pow2=False):
    """The f32 factor the elements of a tile with this amax are multiplied by."""
    max_elem = np.float32(FORMATS[fmt][1])
    amax = np.float32(amax)
    if np.isnan(amax) or np.isinf(amax) or amax == 0:
        return np.float32(1.0)
    with np.errstate(over="ignore"):
        s = np.float32(max_elem / amax)
    if np.isinf(s):
        s = np.float32(np.finfo(np.float32).max)
    if pow2:
        s = np.array(s, np.float32).view(np.uint32) & np.uint32(0xFF800000)
        s = np.array(s, np.uint32).view(np.float32)[()]
    return np.float32(s)


def tiles(shape, block):
    """Every tile of a tensor of ``shape``: (scale index, slices)."""
    counts = [-(-n // b) for n, b in zip(shape, block)]
    for index in itertools.product(*(range(c) for c in counts)):
        yield index, tuple(slice(i * b, min((i + 1) * b, n))
                           for i, b, n in zip(index, block, shape))


def quantize(x, block, fmt="f8E4M3FN", pow2=False):
    """x (float array) -> (data as uint8 bits, f32 scales) of the tiles."""
    dtype, max_elem, _ = FORMATS[fmt]
    x = np.asarray(x, dtype=np.float32)
    if len(block) != x.ndim:
        raise ValueError(f"expected {x.ndim} block sizes, got {len(block)}")
    data = np.empty(x.shape, np.uint8)
    scales = np.empty([-(-n // b) for n, b in zip(x.shape, block)], np.float32)
    for index, where in tiles(x.shape, block):
        t = x[where]
        amax = np.float32(np.nan) if np.isnan(t).any() else np.max(np.abs(t))
        s = tile_scale(amax, fmt, pow2)
        with np.errstate(over="ignore", invalid="ignore"):
            v = (t * s).astype(np.float32)
        v = np.where(np.isnan(v), v, np.clip(v, -max_elem, max_elem))
        data[where] = v.astype(np.float32).astype(dtype).view(np.uint8)
        scales[index] = np.float32(1.0) / s
    return data, scales


def dequantize(data, scales, block, fmt="f8E4M3FN"):
    """(uint8 data bits, f32 scales) -> float32 values q * scale."""
    dtype = FORMATS[fmt][0]
    q = np.asarray(data, np.uint8).view(dtype).astype(np.float32)
    out = np.empty(q.shape, np.float32)
    for index, where in tiles(q.shape, block):
        with np.errstate(over="ignore", invalid="ignore"):
            out[where] = q[where] * np.float32(scales[index])
    return out

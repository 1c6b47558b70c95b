"""Call the functions of a moe-compile'd shared object with numpy arrays.

    art = moe_mlir.load("layer.so")
    print(art.functions)                   # name -> (argument specs, result specs)
    y = art.moe_layer(x, router_w, w1, w2)  # numpy in, numpy out

CPU artifacts only: GPU artifacts take device buffers (see moert-check).
"""

import ctypes
import ctypes.util
import os

import ml_dtypes
import numpy as np

from ._errors import MLIRError

DTYPES = {
    "f32": np.float32, "f64": np.float64, "f16": np.float16,
    "bf16": ml_dtypes.bfloat16, "f8E4M3FN": ml_dtypes.float8_e4m3fn,
    "f8E5M2": ml_dtypes.float8_e5m2, "f8E8M0FNU": ml_dtypes.float8_e8m0fnu,
    "i64": np.int64, "i32": np.int32, "i16": np.int16, "i8": np.int8, "i1": np.bool_,
}

_libc = ctypes.CDLL(ctypes.util.find_library("c"))
_libc.free.argtypes = [ctypes.c_void_p]


class TensorSpec:
    def __init__(self, dtype, shape):
        self.dtype, self.shape = dtype, tuple(shape)

    def __repr__(self):
        return f"tensor<{'x'.join('?' if d < 0 else str(d) for d in self.shape)}x{self.dtype}>"


def parse_manifest(text):
    """The manifest's target and functions: name -> (args, results)."""
    target, functions, current = None, {}, None
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "target":
            target = words[1]
        elif words[0] == "function":
            current = functions.setdefault(words[1], ([], []))
        elif words[0] in ("arg", "result") and current is not None:
            rank = int(words[2])
            spec = TensorSpec(words[1], [int(d) for d in words[3:3 + rank]])
            current[0 if words[0] == "arg" else 1].append(spec)
    return target, functions


def _descriptor_type(rank):
    fields = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p),
              ("offset", ctypes.c_int64)]
    if rank:
        fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    return type(f"MemRef{rank}", (ctypes.Structure,), {"_fields_": fields})


class Artifact:
    def __init__(self, path):
        if not os.path.exists(path):
            raise FileNotFoundError(path)
        self.path = path
        self._lib = ctypes.CDLL(os.path.abspath(path), mode=os.RTLD_LOCAL | os.RTLD_NOW)
        try:
            first = ctypes.c_char.in_dll(self._lib, "moe_manifest")
        except ValueError:
            raise MLIRError(f"{path} has no moe_manifest: not made by moe-compile") from None
        text = ctypes.cast(ctypes.addressof(first), ctypes.c_char_p).value.decode()
        self.target, self.functions = parse_manifest(text)
        if self.target != "cpu":
            raise MLIRError(f"{path} targets {self.target}: only CPU artifacts can be "
                            "called from Python (GPU artifacts take device buffers)")

    def __getattr__(self, name):
        if name.startswith("_") or name not in self.functions:
            raise AttributeError(f"{self.path} has no function {name!r} "
                                 f"(it has {', '.join(self.functions)})")
        return lambda *arrays: self.call(name, *arrays)

    def call(self, name, *arrays):
        args, results = self.functions[name]
        if len(arrays) != len(args):
            raise TypeError(f"{name} takes {len(args)} arrays, got {len(arrays)}")
        keep, pointers = [], []
        for i, (a, spec) in enumerate(zip(arrays, args)):
            dtype = DTYPES.get(spec.dtype)
            if dtype is None:
                raise TypeError(f"{name} argument #{i}: unsupported element type {spec.dtype}")
            a = np.ascontiguousarray(a)
            if a.dtype != np.dtype(dtype):
                raise TypeError(f"{name} argument #{i}: expects {spec}, got an array of {a.dtype}")
            if len(a.shape) != len(spec.shape) or any(
                    d >= 0 and d != s for d, s in zip(spec.shape, a.shape)):
                raise ValueError(f"{name} argument #{i}: expects {spec}, got shape {a.shape}")
            desc = _descriptor_type(a.ndim)()
            desc.allocated = desc.aligned = a.ctypes.data
            desc.offset = 0
            for d in range(a.ndim):
                desc.sizes[d] = a.shape[d]
                desc.strides[d] = a.strides[d] // a.itemsize
            keep += [a, desc]
            pointers.append(ctypes.pointer(desc))
        fields = [(f"r{i}", _descriptor_type(len(r.shape))) for i, r in enumerate(results)]
        out = type("Results", (ctypes.Structure,), {"_fields_": fields})()
        fn = getattr(self._lib, "_mlir_ciface_" + name)
        fn.restype = None
        if results:
            fn(ctypes.pointer(out), *pointers)
        else:
            fn(*pointers)
        values = []
        for i, spec in enumerate(results):
            desc = getattr(out, f"r{i}")
            shape = tuple(desc.sizes[d] for d in range(len(spec.shape)))
            dtype = np.dtype(DTYPES[spec.dtype])
            count = int(np.prod(shape)) if shape else 1
            buf = (ctypes.c_char * (count * dtype.itemsize)).from_address(
                desc.aligned + desc.offset * dtype.itemsize)
            values.append(np.frombuffer(bytes(buf), dtype=dtype).reshape(shape))
            _libc.free(desc.allocated)
        return values[0] if len(values) == 1 else tuple(values)


def load(path):
    """Opens a CPU artifact of moe-compile."""
    return Artifact(path)

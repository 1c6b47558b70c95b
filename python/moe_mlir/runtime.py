"""Call the functions of a moe-compile'd shared object with numpy arrays.

    art = moe_mlir.load("layer.so")
    print(art.functions)                   # name -> (argument specs, result specs)
    y = art.moe_layer(x, router_w, w1, w2)  # numpy in, numpy out

GPU artifacts (moe-compile --target=sm_90a) run through libmoert: numpy
arguments are copied to the device and results back; CUDA torch tensors are
passed in place (8-bit MX data and scales as torch's float8 dtypes) and
results come back as CUDA torch tensors (f32, f16, i32
and i64 ones on the program's own allocations, without a copy). libmoert is
found through MOERT_LIBRARY, MOE_MLIR_BUILD/lib or the loader's search path.
"""

import ctypes
import ctypes.util
import functools
import os

import numpy as np

try:  # numpy dtypes for bf16 and the 8-bit floats
    import ml_dtypes
except ImportError:  # only f32/f16/integer arguments then
    ml_dtypes = None

from ._errors import MLIRError, RuntimeCallError

DTYPES = {
    "f32": np.float32, "f64": np.float64, "f16": np.float16,
    "i64": np.int64, "i32": np.int32, "i16": np.int16, "i8": np.int8, "i1": np.bool_,
}
if ml_dtypes is not None:
    DTYPES.update({"bf16": ml_dtypes.bfloat16, "f8E4M3FN": ml_dtypes.float8_e4m3fn,
                   "f8E5M2": ml_dtypes.float8_e5m2, "f8E8M0FNU": ml_dtypes.float8_e8m0fnu})

_libc = ctypes.CDLL(ctypes.util.find_library("c"))
_libc.free.argtypes = [ctypes.c_void_p]


class TensorSpec:
    def __init__(self, dtype, shape):
        self.dtype, self.shape = dtype, tuple(shape)
        # moe-model graphs: a parameter's name and initialization, whether
        # its last two dims are swapped vs Hugging Face, a data input's role.
        self.param = self.init = self.input = None
        self.hf_transposed = False
        # Optimizer state of argument state_of (-moe-adamw), and whether the
        # call writes the argument in place (its new value).
        self.state, self.state_of, self.updated = None, None, False
        # A result that is an output of a loss function (moe.output), not
        # a loss or a gradient: its name.
        self.output = None

    def __repr__(self):
        return f"tensor<{'x'.join('?' if d < 0 else str(d) for d in self.shape)}x{self.dtype}>"


def parse_manifest(text):
    """The manifest's target, functions (name -> (args, results)) and the
    dynamic argument dimensions each function needs equal (name -> [([(arg,
    dim), ...], size or None)])."""
    target, functions, sizes, current, name = None, {}, {}, None, None
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "target":
            target = words[1]
        elif words[0] == "function":
            name = words[1]
            current = functions.setdefault(name, ([], []))
        elif words[0] == "sizes" and current is not None:
            dims, fixed = words[1:], None
            if len(dims) >= 2 and dims[-2] == "=":
                dims, fixed = dims[:-2], int(dims[-1])
            sizes.setdefault(name, []).append(
                ([tuple(int(x) for x in d.split(":")) for d in dims], fixed))
        elif words[0] in ("arg", "result") and current is not None:
            rank = int(words[2])
            spec = TensorSpec(words[1], [int(d) for d in words[3:3 + rank]])
            rest = words[3 + rank:]
            for i, w in enumerate(rest):
                if w in ("param", "init", "input", "output") and i + 1 < len(rest):
                    setattr(spec, w, rest[i + 1])
                elif w == "hf_transposed":
                    spec.hf_transposed = True
                elif w == "state" and i + 2 < len(rest):
                    spec.state, spec.state_of = rest[i + 1], int(rest[i + 2])
                elif w == "updated":
                    spec.updated = True
            current[0 if words[0] == "arg" else 1].append(spec)
    return target, functions, sizes


_moert = None


def moert():
    """libmoert, loaded once with its symbols global (GPU artifacts need them)."""
    global _moert
    if _moert is None:
        candidates = [os.environ.get("MOERT_LIBRARY")]
        if os.environ.get("MOE_MLIR_BUILD"):
            candidates.append(os.path.join(os.environ["MOE_MLIR_BUILD"], "lib", "libmoert.so"))
        candidates.append("libmoert.so")
        errors = []
        for path in filter(None, candidates):
            try:
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                break
            except OSError as err:
                errors.append(str(err))
        else:
            raise MLIRError("cannot load libmoert (set MOERT_LIBRARY): " + "; ".join(errors))
        lib.mgpuStreamCreate.restype = ctypes.c_void_p
        lib.mgpuMemAlloc.restype = ctypes.c_void_p
        lib.mgpuMemAlloc.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_bool]
        lib.mgpuMemFree.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.mgpuMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                   ctypes.c_void_p]
        lib.mgpuStreamSynchronize.argtypes = [ctypes.c_void_p]
        lib.mgpuStreamDestroy.argtypes = [ctypes.c_void_p]
        lib.moert_last_error.restype = ctypes.c_char_p
        _moert = lib
    return _moert


def _check_runtime():
    """Raises libmoert's sticky error, if a call set one (the C entry points
    have no error return), and clears it."""
    if _moert is None:
        return
    text = _moert.moert_last_error()
    if text:
        _moert.moert_clear_error()
        raise RuntimeCallError("moert: " + text.decode(errors="replace"))


_gpu_ready = False


def _gpu():
    """libmoert with the GPU initialized (done once, before any GPU call)."""
    global _gpu_ready
    lib = moert()
    if not _gpu_ready:
        lib.moert_gpu_init()
        _check_runtime()  # no usable GPU
        _gpu_ready = True
    return lib


def _is_torch(a):
    return hasattr(a, "data_ptr") and hasattr(a, "is_cuda")


# Element types as torch dtype names, __cuda_array_interface__ typestrs
# (torch has none for bf16 and the 8-bit floats: they pass as integers of
# their size and are viewed back) and sizes in bytes.
_TORCH_TYPES = {"f32": ("float32", "<f4", 4), "bf16": ("bfloat16", "<i2", 2),
                "f16": ("float16", "<f2", 2), "i32": ("int32", "<i4", 4),
                "i64": ("int64", "<i8", 8), "i8": ("int8", "|i1", 1),
                "f8E4M3FN": ("float8_e4m3fn", "|u1", 1),
                "f8E5M2": ("float8_e5m2", "|u1", 1),
                "f8E8M0FNU": ("float8_e8m0fnu", "|u1", 1)}
# The torch dtype (its str) a CUDA tensor argument of each element type has.
_TORCH_ARG_TYPES = {k: "torch." + v[0] for k, v in _TORCH_TYPES.items()}
# Result element types call() returns without a copy (its bf16 results are
# copied; call_torch views those back instead).
_CUDA_TYPESTR = {k: _TORCH_TYPES[k][1] for k in ("f32", "f16", "i32", "i64")}


def _check_shape(name, i, spec, shape):
    """Raises ValueError unless `shape` is argument #i's of `spec`."""
    if len(shape) != len(spec.shape) or any(
            d >= 0 and d != s for d, s in zip(spec.shape, shape)):
        raise ValueError(f"{name} argument #{i}: expects {spec}, got shape {shape}")


class GpuMemoryStats(ctypes.Structure):
    """libmoert's struct moert_gpu_memory_stats (moert/Gpu.h)."""
    _fields_ = [("in_use", ctypes.c_size_t), ("cached", ctypes.c_size_t),
                ("peak", ctypes.c_size_t), ("allocs", ctypes.c_uint64),
                ("reuses", ctypes.c_uint64), ("peak_reserved", ctypes.c_size_t)]


def gpu_memory_stats():
    """libmoert's device memory counters (bytes in use, cached, the peak in
    use; allocations, cache reuses; the peak reserved, in use and cached);
    all zero before libmoert is loaded."""
    stats = GpuMemoryStats()
    if _moert is not None:
        _moert.moert_gpu_get_memory_stats(ctypes.byref(stats))
    return stats


class _DeviceAllocation:
    """A result allocation of libmoert's that torch tensors use in place.
    Given back to libmoert's cache when the last of them goes, after the work
    torch's current stream has queued by then (the allocator makes any later
    reuse wait for it)."""

    def __init__(self, rt, allocated):
        self.rt, self.allocated = rt, allocated

    def __del__(self):
        try:
            import torch
            stream = torch.cuda.current_stream().cuda_stream
            self.rt.mgpuMemFree(self.allocated, ctypes.c_void_p(stream))
        except Exception:  # interpreter shutdown: the process frees it all
            pass


class _DeviceView:
    """One result as __cuda_array_interface__ (torch.as_tensor keeps this
    object, and so the allocation, alive as long as the tensor's storage)."""

    def __init__(self, owner, ptr, shape, typestr):
        self.owner = owner
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": typestr, "data": (ptr, False),
            "strides": None, "version": 2}


@functools.lru_cache(maxsize=None)
def _descriptor_type(rank):
    """The ctypes struct of a rank-`rank` memref descriptor (built once a
    rank: making a ctypes type costs tens of microseconds, a call needs one
    per array)."""
    fields = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p),
              ("offset", ctypes.c_int64)]
    if rank:
        fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    return type(f"MemRef{rank}", (ctypes.Structure,), {"_fields_": fields})


def _descriptor(ptr, shape):
    """The memref descriptor of a row-major array of `shape` at `ptr`."""
    desc = _descriptor_type(len(shape))()
    desc.allocated = desc.aligned = ptr
    desc.offset = 0
    stride = 1
    for d in reversed(range(len(shape))):
        desc.sizes[d] = shape[d]
        desc.strides[d] = stride
        stride *= shape[d]
    return desc


class Artifact:
    def __init__(self, path):
        if not os.path.exists(path):
            raise FileNotFoundError(path)
        self.path = path
        # A GPU artifact's mgpu* calls resolve against libmoert; loading the
        # runtime first is harmless for CPU artifacts only if it exists, so
        # it is loaded on demand below.
        try:
            self._lib = ctypes.CDLL(os.path.abspath(path), mode=os.RTLD_LOCAL | os.RTLD_NOW)
        except OSError as err:
            # GPU artifacts call mgpu*, expert-parallel ones moert_*: both
            # come from libmoert, loaded with global symbols.
            if "mgpu" not in str(err) and "moert" not in str(err):
                raise
            moert()
            self._lib = ctypes.CDLL(os.path.abspath(path), mode=os.RTLD_LOCAL | os.RTLD_NOW)
        try:
            first = ctypes.c_char.in_dll(self._lib, "moe_manifest")
        except ValueError:
            raise MLIRError(f"{path} has no moe_manifest: not made by moe-compile") from None
        text = ctypes.cast(ctypes.addressof(first), ctypes.c_char_p).value.decode()
        self.target, self.functions, self._sizes = parse_manifest(text)
        self.gpu = self.target != "cpu"

    def __getattr__(self, name):
        if name.startswith("_") or name not in self.functions:
            raise AttributeError(f"{self.path} has no function {name!r} "
                                 f"(it has {', '.join(self.functions)})")
        return lambda *arrays: self.call(name, *arrays)

    def call(self, name, *arrays):
        """Calls `name`. CPU: numpy in, numpy out. GPU: numpy in and out
        (copied), or CUDA torch tensors in and out (in place). Arguments the
        function updates (`updated` in the manifest: the parameters and
        optimizer moments of a train step) are written in place: pass
        writable arrays or tensors of the argument's type."""
        args, results = self.functions[name]
        if len(arrays) != len(args):
            raise TypeError(f"{name} takes {len(args)} arrays, got {len(arrays)}")
        on_device = self.gpu and all(_is_torch(a) and a.is_cuda for a in arrays)
        rt = _gpu() if self.gpu else None
        stream = rt.mgpuStreamCreate() if self.gpu else None
        keep, pointers, staged, shapes = [], [], [], []
        write_back = []  # (the caller's array, what the call wrote, device copy)
        try:
            for i, (a, spec) in enumerate(zip(arrays, args)):
                given = a
                if spec.updated and not (_is_torch(a) or
                                         (isinstance(a, np.ndarray) and a.flags.writeable)):
                    raise TypeError(f"{name} argument #{i} is updated in place: pass a "
                                    f"writable numpy array or torch tensor, not {type(a).__name__}")
                dtype = DTYPES.get(spec.dtype)
                # (CUDA torch tensors need no numpy dtype: bf16 and the
                # 8-bit floats pass without ml_dtypes.)
                if dtype is None and not on_device:
                    raise TypeError(f"{name} argument #{i}: unsupported element type {spec.dtype}")
                if on_device:
                    a = a.contiguous()
                    got_dtype, shape, ptr = str(a.dtype), tuple(a.shape), a.data_ptr()
                    want = _TORCH_ARG_TYPES.get(spec.dtype)
                    if want is None:
                        raise TypeError(f"{name} argument #{i}: unsupported element type {spec.dtype}")
                    if got_dtype != want:
                        raise TypeError(f"{name} argument #{i}: expects {spec}, got {got_dtype}")
                else:
                    if _is_torch(a):
                        a = a.detach().cpu().numpy()
                    a = np.ascontiguousarray(a)
                    if a.dtype != np.dtype(dtype):
                        raise TypeError(f"{name} argument #{i}: expects {spec}, got an array of {a.dtype}")
                    shape, ptr = a.shape, a.ctypes.data
                    if self.gpu:  # stage on the device
                        dev = rt.mgpuMemAlloc(max(a.nbytes, 1), stream, False)
                        rt.mgpuMemcpy(dev, ptr, a.nbytes, stream)
                        staged.append(dev)
                        ptr = dev
                _check_shape(name, i, spec, shape)
                shapes.append(shape)
                if spec.updated:
                    write_back.append((given, a, ptr if self.gpu and not on_device else None))
                desc = _descriptor(ptr, shape)
                keep += [a, desc]
                pointers.append(ctypes.pointer(desc))
            # Dynamic dimensions the program needs equal (or of a fixed
            # size): unchecked, they would index outside the arrays.
            for dims, fixed in self._sizes.get(name, []):
                got = [shapes[a][d] for a, d in dims]
                want = fixed if fixed is not None else got[0]
                if any(g != want for g in got):
                    told = ", ".join(f"argument #{a} dim {d} is {shapes[a][d]}" for a, d in dims)
                    raise ValueError(f"{name}: these sizes must be "
                                     f"{want if fixed is not None else 'equal'}: {told}")
            if self.gpu:
                rt.mgpuStreamSynchronize(stream)
                if on_device:
                    import torch
                    torch.cuda.synchronize()
            fields = [(f"r{i}", _descriptor_type(len(r.shape))) for i, r in enumerate(results)]
            out = type("Results", (ctypes.Structure,), {"_fields_": fields})()
            fn = getattr(self._lib, "_mlir_ciface_" + name)
            fn.restype = None
            _check_runtime()  # staging the arguments
            if results:
                fn(ctypes.pointer(out), *pointers)
            else:
                fn(*pointers)
            _check_runtime()  # what the program's runtime calls reported
            values = []
            # Results may share a buffer (two results aliasing one tensor, or
            # views of it): everything is copied out first, then each
            # allocation is freed once; argument buffers are never freed.
            # CUDA torch results (f32, f16, i32, i64) are not copied: the
            # tensors use the program's allocations, which return to
            # libmoert's cache when the tensors go (_DeviceAllocation).
            # The copies are queued on the call's stream, which is drained
            # before returning (finally); frees are stream-ordered.
            to_free, owners = {}, {}
            inputs = {p.contents.allocated for p in pointers}
            for i, spec in enumerate(results):
                desc = getattr(out, f"r{i}")
                shape = tuple(desc.sizes[d] for d in range(len(spec.shape)))
                dtype = np.dtype(DTYPES[spec.dtype])
                nbytes = (int(np.prod(shape)) if shape else 1) * dtype.itemsize
                src = desc.aligned + desc.offset * dtype.itemsize
                if not self.gpu:
                    buf = (ctypes.c_char * nbytes).from_address(src)
                    values.append(np.frombuffer(bytes(buf), dtype=dtype).reshape(shape))
                elif on_device:
                    import torch
                    owned = desc.allocated and desc.allocated not in inputs
                    if owned and nbytes and spec.dtype in _CUDA_TYPESTR:
                        owner = owners.setdefault(
                            desc.allocated, _DeviceAllocation(rt, desc.allocated))
                        values.append(torch.as_tensor(
                            _DeviceView(owner, src, shape, _CUDA_TYPESTR[spec.dtype]),
                            device="cuda"))
                        continue
                    tdtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16,
                              "i32": torch.int32, "i64": torch.int64}[spec.dtype]
                    t = torch.empty(shape, dtype=tdtype, device="cuda")
                    rt.mgpuMemcpy(t.data_ptr(), src, nbytes, stream)
                    values.append(t)
                else:
                    host = np.empty(shape, dtype=dtype)
                    rt.mgpuMemcpy(host.ctypes.data, src, nbytes, stream)
                    values.append(host)
                if desc.allocated and desc.allocated not in inputs:
                    to_free[desc.allocated] = True
            # Updated arguments: staged or converted copies go back to the
            # caller's arrays.
            for given, a, dev in write_back:
                if dev is not None:
                    rt.mgpuMemcpy(a.ctypes.data, dev, a.nbytes, stream)
                    rt.mgpuStreamSynchronize(stream)
                if a is not given:
                    if _is_torch(given):
                        import torch
                        given.copy_(a if _is_torch(a) else torch.from_numpy(a))
                    else:
                        np.copyto(given, a)
            for allocated in to_free:
                if allocated in owners:
                    continue  # also a result torch holds
                if self.gpu:
                    rt.mgpuMemFree(allocated, stream)
                else:
                    _libc.free(allocated)
            return values[0] if len(values) == 1 else tuple(values)
        finally:
            if self.gpu:
                for dev in staged:
                    rt.mgpuMemFree(dev, stream)
                rt.mgpuStreamSynchronize(stream)
                rt.mgpuStreamDestroy(stream)
                _check_runtime()


    def call_torch(self, name, *tensors):
        """Calls `name` of a GPU artifact with CUDA tensors (torch's, or any
        DLPack producer's, taken without a copy) on torch's current stream,
        without synchronizing: the program's work is queued
        on that stream (libmoert's moert_gpu_set_stream) and the results,
        torch tensors on the program's own allocations (bf16 ones too), are
        ready for whatever torch queues after it. Arguments must have the
        manifest's dtypes and shapes (non-contiguous ones are copied)."""
        import torch
        if not self.gpu:
            raise TypeError(f"{self.path} is a CPU artifact: use call()")
        args, results = self.functions[name]
        if len(tensors) != len(args):
            raise TypeError(f"{name} takes {len(args)} tensors, got {len(tensors)}")
        if any(spec.updated for spec in args):
            raise TypeError(f"{name} updates arguments in place: use call()")
        rt = _gpu()
        pointers, keep = [], []
        for i, (t, spec) in enumerate(zip(tensors, args)):
            if not _is_torch(t) and hasattr(t, "__dlpack__"):
                t = torch.from_dlpack(t)  # CuPy, JAX, ... arrays: no copy
            if not (_is_torch(t) and t.is_cuda):
                raise TypeError(f"{name} argument #{i}: expects a CUDA tensor (torch, or "
                                f"any DLPack producer), got {type(t).__name__}")
            if str(t.dtype) != _TORCH_ARG_TYPES.get(spec.dtype):
                raise TypeError(f"{name} argument #{i}: expects {spec}, got {t.dtype}")
            shape = tuple(t.shape)
            _check_shape(name, i, spec, shape)
            t = t.contiguous()
            desc = _descriptor(t.data_ptr(), shape)
            keep += [t, desc]
            pointers.append(ctypes.pointer(desc))
        cached = self.__dict__.setdefault("_torch_calls", {}).get(name)
        if cached is None:  # the entry point and results struct, made once
            fields = [(f"r{i}", _descriptor_type(len(r.shape))) for i, r in enumerate(results)]
            fn = getattr(self._lib, "_mlir_ciface_" + name)
            fn.restype = None
            cached = self._torch_calls[name] = (
                fn, type("Results", (ctypes.Structure,), {"_fields_": fields}))
        fn, results_type = cached
        out = results_type()
        stream = torch.cuda.current_stream().cuda_stream
        _check_runtime()
        rt.moert_gpu_set_stream(ctypes.c_void_p(stream))
        try:
            fn(ctypes.pointer(out), *pointers) if results else fn(*pointers)
        finally:
            rt.moert_gpu_clear_stream()
        _check_runtime()
        values, owners = [], {}
        inputs = {p.contents.allocated for p in pointers}
        for i, spec in enumerate(results):
            desc = getattr(out, f"r{i}")
            shape = tuple(desc.sizes[d] for d in range(len(spec.shape)))
            torch_name, typestr, size = _TORCH_TYPES[spec.dtype]
            src = desc.aligned + desc.offset * size
            if shape and not all(shape):  # no elements: nothing to view
                values.append(torch.empty(shape, dtype=getattr(torch, torch_name),
                                          device="cuda"))
                continue
            # An argument returned as it is is copied (the caller's tensor
            # stays the caller's); other results are used in place.
            owner = None if desc.allocated in inputs else owners.setdefault(
                desc.allocated, _DeviceAllocation(rt, desc.allocated))
            t = torch.as_tensor(_DeviceView(owner, src, shape, typestr), device="cuda")
            if str(t.dtype) != "torch." + torch_name:
                t = t.view(getattr(torch, torch_name))
            values.append(t if owner else t.clone())
        return values


def load(path):
    """Opens an artifact of moe-compile (CPU or GPU).""" 
    return Artifact(path)

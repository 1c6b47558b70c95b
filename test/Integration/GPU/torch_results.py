"""CUDA torch tensors in and out of a compiled GPU artifact (run by
scripts/gpu-check.sh on a GPU machine; needs torch and libmoert).

Results come back without a copy where torch can take them
(__cuda_array_interface__: f32, f16, i32, i64) and are copied otherwise (bf16).
Checked here: the values equal the numpy path's (host in, copied host out);
results held across later calls keep their values (the allocation is not
reused while torch holds it); an input at an address that is not a multiple
of 16 bytes gives the same result; results sharing a call are independent; and
when the tensors go, their memory returns to libmoert's cache (bytes in use
back to where they were).

    python3 torch_results.py ARTIFACT.so
"""
import sys

import numpy as np
import torch

from moe_mlir import load, runtime


def in_use():
    return runtime.gpu_memory_stats().in_use


def main(path):
    art = load(path)
    failures = 0

    def check(what, ok):
        nonlocal failures
        print(f"{what:60s} {'ok' if ok else 'FAILED'}")
        failures += 0 if ok else 1

    g = torch.Generator().manual_seed(0)
    h = [torch.randn(512, 256, generator=g) for _ in range(2)]
    x = torch.randn(8, 64, generator=g)

    # f32 result, no copy: equal to the numpy path, and held across calls.
    want = [art.swiglu(t.numpy()) for t in h]
    hd = [t.cuda() for t in h]
    base = in_use()
    got0 = art.swiglu(hd[0])
    got1 = art.swiglu(hd[1])  # must not reuse got0's memory
    torch.cuda.synchronize()
    check("swiglu f32 result (no copy) equals the numpy path",
          np.array_equal(got0.cpu().numpy(), want[0]))
    check("a result held across a later call keeps its values",
          np.array_equal(got1.cpu().numpy(), want[1]) and got0.data_ptr() != got1.data_ptr())
    check("results are torch CUDA tensors of the declared type",
          got0.is_cuda and got0.dtype == torch.float32 and tuple(got0.shape) == (512, 128))
    doubled = got0 * 2  # torch kernels on the result, queued before it goes
    del got0, got1
    torch.cuda.synchronize()
    check("the results' memory returns to libmoert's cache", in_use() == base)
    check("torch work queued on a result before it went completes",
          np.array_equal(doubled.cpu().numpy(), want[0] * 2))

    # A tensor 4 bytes past a 16-byte boundary: the generic kernels' 16-byte
    # vector accesses do not apply to it, their scalar loops run instead.
    odd = torch.empty(512 * 256 + 1, device="cuda")[1:].view(512, 256)
    odd.copy_(hd[0])
    check("an input off the vectors' alignment gives the same result",
          odd.data_ptr() % 16 != 0 and np.array_equal(art.swiglu(odd).cpu().numpy(), want[0]))

    # Two results of one call: bf16 (copied) and f32 (no copy). The first
    # call (numpy) places the function's constants on the device for good.
    w16, w32 = art.mx_round_trip_specials(x.numpy())
    xd = x.cuda()
    base = in_use()
    g16, g32 = art.mx_round_trip_specials(xd)
    torch.cuda.synchronize()
    ok16 = np.array_equal(g16.float().cpu().numpy(), np.asarray(w16, dtype=np.float32),
                          equal_nan=True)
    ok32 = np.array_equal(g32.cpu().numpy(), w32, equal_nan=True)
    check("bf16 (copied) and f32 results of one call equal the numpy path", ok16 and ok32)
    del g16, g32
    torch.cuda.synchronize()
    check("and their memory returns to the cache", in_use() == base)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
